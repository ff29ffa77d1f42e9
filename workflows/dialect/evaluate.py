"""Evaluating a parse tree against the data of a run (relay-core pkg/expr/evaluate).

`{"$type": ...}` maps (from the YAML tags) resolve to parameters, secrets, connections,
outputs, event data, answers and step statuses; `{"$fn.name": args}` maps call a function;
`{"$encoding": "base64", "data": ...}` decodes; every string is a template. What is not
there yet stays in place and is listed in the result's `unresolvable`.

Only the document is evaluated: a value that arrives as data (a parameter, an output, event
data, a secret's or connection's value, what a function returns) is never read as an
expression again, by this evaluator, a function or a query.
"""

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

from workflows.dialect import expr
from workflows.dialect.errors import ArgumentError, EvaluationError, InvocationError, UnknownKey
from workflows.dialect.expr import ExpressionError, Options, Template, evaluate_query, parse_template
from workflows.dialect.fn import Descriptor
from workflows.dialect.fnlib import LIBRARY
from workflows.dialect.model import (
    DEFAULT_EVALUATOR,
    Context,
    Evaluated,
    Evaluator,
    Expandable,
    Indexable,
    Result,
    StaticExpandable,
    Unresolvable,
    combine_map,
    evaluate_all,
    unresolved,
)
from workflows.dialect.values import type_name

MISSING = object()


@dataclass
class Data:
    """What a run knows so far. A name that is absent is not resolvable yet.

    `event` is the triggering event's data; it exists only where relay-core offers it (a
    trigger's `when` and bindings): elsewhere `${event}` is an unknown name and `!Data` is
    unresolvable."""

    parameters: dict[str, Any] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)
    connections: dict[tuple[str, str], Any] = field(default_factory=dict)  # (type, name)
    outputs: dict[tuple[str, str], Any] = field(default_factory=dict)  # (step, name)
    answers: dict[tuple[str, str], Any] = field(default_factory=dict)  # (askRef, name)
    statuses: dict[str, str] = field(default_factory=dict)  # step -> its resolved status
    event: Any = MISSING
    event_available: bool = False


def _grouped(pairs: dict[tuple[str, str], Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for (group, name), value in pairs.items():
        out.setdefault(group, {})[name] = value
    return out


class _Adapter(Expandable, Indexable):
    """One top-level name of the template data (`parameters`, `outputs`, ...)."""

    def __init__(self, data: Data) -> None:
        self.data = data

    def expand(self, ctx: Context, depth: int) -> Result:
        if depth == 0:
            return Result(self)
        return Result(self.everything())

    def everything(self) -> Any:
        raise NotImplementedError


class _Parameters(_Adapter):
    def lookup(self, ctx: Context, key: Any) -> Any:
        name = expr.string_key(key)
        if name not in self.data.parameters:
            return unresolved(parameters={(name,)})
        return self.data.parameters[name]

    def everything(self) -> Any:
        return dict(self.data.parameters)


class _Secrets(_Adapter):
    def lookup(self, ctx: Context, key: Any) -> Any:
        name = expr.string_key(key)
        if name not in self.data.secrets:
            return StaticExpandable("", Unresolvable(secrets={(name,)}))
        return self.data.secrets[name]

    def everything(self) -> Any:
        return dict(self.data.secrets)


class _Group(_Adapter):
    """`connections.<type>` or `outputs.<step>`."""

    def __init__(self, data: Data, kind: str, group: str) -> None:
        super().__init__(data)
        self.kind = kind
        self.group = group

    def lookup(self, ctx: Context, key: Any) -> Any:
        name = expr.string_key(key)
        values = getattr(self.data, self.kind)
        if (self.group, name) not in values:
            return unresolved(**{self.kind: {(self.group, name)}})
        return values[(self.group, name)]

    def everything(self) -> Any:
        return _grouped(getattr(self.data, self.kind)).get(self.group)


class _Groups(_Adapter):
    def __init__(self, data: Data, kind: str) -> None:
        super().__init__(data)
        self.kind = kind

    def lookup(self, ctx: Context, key: Any) -> Any:
        return _Group(self.data, self.kind, expr.string_key(key))

    def everything(self) -> Any:
        return _grouped(getattr(self.data, self.kind)) or None


class _Event(_Adapter):
    def expand(self, ctx: Context, depth: int) -> Result:
        if depth != 0 and self.data.event is MISSING:
            return Result(None, Unresolvable(data={("",)}))
        return super().expand(ctx, depth)

    def lookup(self, ctx: Context, key: Any) -> Any:
        if self.data.event is MISSING:
            return unresolved(data={("",)})
        return expr.select(ctx, self.data.event, key)

    def everything(self) -> Any:
        return self.data.event


class _Environment(Expandable, Indexable):
    """The root of template data: its names and nothing else."""

    def __init__(self, data: Data) -> None:
        self.names: dict[str, _Adapter] = {}
        if data.event_available:
            self.names["event"] = _Event(data)
        self.names["secrets"] = _Secrets(data)
        self.names["connections"] = _Groups(data, "connections")
        self.names["outputs"] = _Groups(data, "outputs")
        self.names["parameters"] = _Parameters(data)

    def lookup(self, ctx: Context, key: Any) -> Any:
        name = expr.string_key(key)
        if name not in self.names:
            raise UnknownKey(name)
        return self.names[name]

    def expand(self, ctx: Context, depth: int) -> Result:
        if depth == 0:
            return Result(self)
        return combine_map({name: adapter.expand(ctx, depth - 1) for name, adapter in self.names.items()})


TEMPLATE_NAMES = ("event", "secrets", "connections", "outputs", "parameters")


class WorkflowEvaluator(Evaluator):
    """The evaluator of workflow documents: relay-core's evaluate.NewEvaluator."""

    def __init__(self, data: Data | None = None, functions: dict[str, Descriptor] | None = None) -> None:
        self.data = data or Data()
        self.functions = LIBRARY if functions is None else functions
        self.environment = _Environment(self.data)
        self.template_options = Options(functions=self.functions)
        self._templates: dict[str, Template] = {}

    def template(self, text: str) -> Template:
        """The parsed template (parsed once per evaluator: a document repeats its strings)."""
        if text not in self._templates:
            self._templates[text] = parse_template(text, self.template_options)
        return self._templates[text]

    def visit_string(self, ctx: Context, text: str, depth: int) -> Result:
        if "$" not in text:
            return Result(text)
        try:
            template = self.template(text)
        except ExpressionError as exc:
            raise EvaluationError(f"the expression cannot be read: {exc}") from None
        unresolvable = Unresolvable()
        try:
            value = template.evaluate(ctx, self.environment, unresolvable)
        except EvaluationError:
            if unresolvable:
                return Result(text, unresolvable)
            raise
        result = evaluate_all(ctx, DEFAULT_EVALUATOR, value)
        result.unresolvable.extend(unresolvable)
        if not result.complete:
            return Result(text, result.unresolvable)
        return result

    def is_plain_map(self, mapping: dict[str, Any]) -> bool:
        if "$type" in mapping or "$encoding" in mapping:
            return False
        return not (len(mapping) == 1 and next(iter(mapping)).startswith("$fn."))

    def visit_map(self, ctx: Context, mapping: dict[str, Any], depth: int) -> Result:
        if "$type" in mapping:
            return self.evaluate_type(ctx, mapping)
        if "$encoding" in mapping:
            return self.evaluate_encoding(ctx, mapping)
        if len(mapping) == 1:
            (key,) = mapping
            if key.startswith("$fn."):
                return self.evaluate_invocation(ctx, mapping, key)
        return self.visit_plain_map(ctx, mapping, depth)

    def evaluate_type(self, ctx: Context, tm: dict[str, Any]) -> Result:
        kind = tm["$type"]

        def text(name: str) -> str:
            value = tm.get(name)
            if not isinstance(value, str):
                raise EvaluationError(
                    f'could not evaluate a {kind} type: the required field "{name}" could not be found'
                )
            return value

        def missing(**unresolved_kinds: set[Any]) -> Result:
            return Result(tm, Unresolvable(**unresolved_kinds))

        data = self.data
        if kind == "Data":
            query = text("query")
            if data.event is MISSING:
                return missing(data={("",)})
            try:
                result = evaluate_query(ctx, data.event, query)
            except EvaluationError as exc:
                raise EvaluationError(f'could not evaluate a Data type: query "{query}": {exc}') from None
            if not result.complete:
                return Result(tm, result.unresolvable)
            return Result(result.value)
        if kind == "Secret":
            name = text("name")
            return Result(data.secrets[name]) if name in data.secrets else missing(secrets={(name,)})
        if kind == "Connection":
            key = (text("type"), text("name"))
            return Result(data.connections[key]) if key in data.connections else missing(connections={key})
        if kind == "Output":
            source = tm.get("from", tm.get("taskName"))  # taskName: relay-core's old spelling
            if not isinstance(source, str):
                raise EvaluationError(
                    'could not evaluate a Output type: the required field "from" could not be found'
                )
            key = (source, text("name"))
            return Result(data.outputs[key]) if key in data.outputs else missing(outputs={key})
        if kind == "Parameter":
            name = text("name")
            return Result(data.parameters[name]) if name in data.parameters else missing(parameters={(name,)})
        if kind == "Answer":
            key = (text("askRef"), text("name"))
            return Result(data.answers[key]) if key in data.answers else missing(answers={key})
        if kind == "Status":
            name = text("name")
            return Result(data.statuses[name]) if name in data.statuses else missing(statuses={(name,)})
        return Result(tm)

    def evaluate_encoding(self, ctx: Context, em: dict[str, Any]) -> Result:
        encoding = em["$encoding"]
        if not isinstance(encoding, str):
            return Result(em)
        try:
            inner = evaluate_all(ctx, self, em.get("data"))
        except EvaluationError as exc:
            raise EvaluationError(f'could not evaluate encoding "{encoding}": {exc}') from None
        if not inner.complete:
            return Result({"$encoding": encoding, "data": inner.value}, inner.unresolvable)
        if not isinstance(inner.value, str):
            raise EvaluationError(
                f'could not evaluate encoding "{encoding}": '
                f"fn: unexpected type {type_name(inner.value)} (wanted string)"
            )
        if encoding == "":
            return Result(inner.value)
        if encoding != "base64":
            raise EvaluationError(
                f'could not evaluate encoding "{encoding}": transfer: unknown encoding type'
            )
        try:
            decoded = base64.b64decode(inner.value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise EvaluationError(f'could not evaluate encoding "{encoding}": {exc}') from None
        return Result(decoded.decode("utf-8", "surrogateescape"))

    def evaluate_invocation(self, ctx: Context, im: dict[str, Any], key: str) -> Result:
        name = key[len("$fn.") :]
        value = im[key]
        descriptor = self.functions.get(name)
        if descriptor is None:
            return Result(im, Unresolvable(invocations={(name, "function not found")}))
        try:
            # One level decides between positional (a list) and keyword (a map) arguments.
            top = self.evaluate(ctx, value, 1)
            args = top.value
            written = isinstance(value, list) or (isinstance(value, dict) and self.is_plain_map(value))
            if top.complete and not written:
                # The arguments are what a reference, template or call yielded: data, which
                # the function must not evaluate as the document's own lists and maps.
                if isinstance(args, list):
                    args = [Evaluated(item) for item in args]
                elif isinstance(args, dict):
                    args = {k: Evaluated(v) for k, v in args.items()}
                else:
                    args = Evaluated(args)
            if not top.complete:
                invoker = descriptor.positional(self, [value])
            elif isinstance(args, list):
                invoker = descriptor.positional(self, args)
            elif isinstance(args, dict):
                invoker = descriptor.keyword(self, args)
            else:
                invoker = descriptor.positional(self, [args])
        except ArgumentError as exc:
            return Result(im, Unresolvable(invocations={(name, str(exc))}))
        try:
            result = invoker(ctx)
        except InvocationError:
            raise
        except EvaluationError as exc:
            raise InvocationError(name, exc) from None
        if not result.complete:
            return Result({key: result.value}, result.unresolvable)
        return result


def evaluate(tree: Any, data: Data | None = None, ctx: Context | None = None) -> Result:
    """The whole tree evaluated; raises EvaluationError when it cannot be."""
    return evaluate_all(ctx or Context(), WorkflowEvaluator(data), tree)
