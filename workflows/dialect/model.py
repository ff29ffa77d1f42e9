"""The evaluation model of relay-core's pkg/expr/model: results that say what could not be
resolved yet, values that expand lazily, and the tree walk.

A reference to data that is not there yet (an output of a step still running, a secret not
set) is not an error: the walk leaves the reference in place and lists it in the result's
`unresolvable`. The engine uses that to know when a step is ready.
"""

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from workflows.dialect.errors import EvaluationError, PathError
from workflows.dialect.values import type_name

UNRESOLVABLE_KINDS = (
    "data",
    "secrets",
    "connections",
    "outputs",
    "parameters",
    "answers",
    "statuses",
    "invocations",
)


@dataclass
class Unresolvable:
    """What an evaluation needed and could not get. Each kind is a set of tuples:
    data (name,), secrets (name,), connections (type, name), outputs (from, name),
    parameters (name,), answers (askRef, name), statuses (step,), invocations (function, why)."""

    data: set[tuple[str]] = field(default_factory=set)
    secrets: set[tuple[str]] = field(default_factory=set)
    connections: set[tuple[str, str]] = field(default_factory=set)
    outputs: set[tuple[str, str]] = field(default_factory=set)
    parameters: set[tuple[str]] = field(default_factory=set)
    answers: set[tuple[str, str]] = field(default_factory=set)
    statuses: set[tuple[str]] = field(default_factory=set)
    invocations: set[tuple[str, str]] = field(default_factory=set)

    def extend(self, other: "Unresolvable") -> None:
        if other:  # most often empty: every value of an evaluation extends its parent's
            for kind in UNRESOLVABLE_KINDS:
                getattr(self, kind).update(getattr(other, kind))

    def __bool__(self) -> bool:
        # Asked of every value evaluated (Result.complete): spelt out, not a loop.
        return bool(
            self.data
            or self.secrets
            or self.connections
            or self.outputs
            or self.parameters
            or self.answers
            or self.statuses
            or self.invocations
        )

    def as_dict(self) -> dict[str, list[dict[str, str]]]:
        """The JSON form of relay-core's metadata API (names sorted), kinds with nothing left out."""
        fields = {
            "data": ("name",),
            "secrets": ("name",),
            "connections": ("type", "name"),
            "outputs": ("from", "name"),
            "parameters": ("name",),
            "answers": ("askRef", "name"),
            "statuses": ("name",),
            "invocations": ("name", "cause"),
        }
        out: dict[str, list[dict[str, str]]] = {}
        for kind, names in fields.items():
            entries = sorted(getattr(self, kind))
            if entries:
                out[kind] = [dict(zip(names, entry, strict=True)) for entry in entries]
        return out


@dataclass
class Result:
    value: Any
    unresolvable: Unresolvable = field(default_factory=Unresolvable)

    @property
    def complete(self) -> bool:
        return not self.unresolvable


@dataclass
class Context:
    """What one evaluation carries: where unresolved references are noted (relay-core keeps
    this in a context.Context) and the clock for now()."""

    unresolvable: Unresolvable = field(default_factory=Unresolvable)
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)

    def fresh(self) -> "Context":
        return Context(unresolvable=Unresolvable(), clock=self.clock)


class Expandable(ABC):
    """A value that expands when evaluated (relay-core's model.Expandable)."""

    @abstractmethod
    def expand(self, ctx: Context, depth: int) -> Result: ...


class Indexable(ABC):
    """A value that answers `value[key]` itself (relay-core's eval.Indexable)."""

    @abstractmethod
    def lookup(self, ctx: Context, key: Any) -> Any: ...


class StaticExpandable(Expandable):
    """A value with what is missing to complete it (relay-core's model.StaticExpandable)."""

    def __init__(self, value: Any, unresolvable: Unresolvable) -> None:
        self.result = Result(value, unresolvable)

    def expand(self, ctx: Context, depth: int) -> Result:
        return self.result


def unresolved(**kinds: set[Any]) -> StaticExpandable:
    return StaticExpandable(None, Unresolvable(**kinds))


class Evaluator:
    """relay-core's visitor evaluator. `depth` is how many levels to expand: -1 is all of them,
    0 returns the tree as it is. Subclasses change how maps and strings evaluate."""

    def evaluate(self, ctx: Context, tree: Any, depth: int) -> Result:
        if depth == 0:
            return Result(tree)
        if isinstance(tree, Expandable):
            result = tree.expand(ctx, depth)
        elif isinstance(tree, list):
            result = self.visit_list(ctx, tree, depth)
        elif isinstance(tree, dict):
            result = self.visit_map(ctx, tree, depth)
        elif isinstance(tree, str):
            result = self.visit_string(ctx, tree, depth)
        else:
            result = Result(tree)
        value = result.value
        if not (value is None or isinstance(value, (bool, int, float, str, list, dict, bytes, datetime))):
            raise EvaluationError(
                f"could not evaluate a value of type {type_name(value)}, must be a YAML-compatible type"
            )
        return result

    def visit_list(self, ctx: Context, items: list[Any], depth: int) -> Result:
        if depth == 1:
            return Result(items)
        result = Result([])
        for index, item in enumerate(items):
            try:
                r = self.evaluate(ctx, item, depth - 1)
            except EvaluationError as exc:
                raise PathError(str(index), exc) from None
            result.unresolvable.extend(r.unresolvable)
            result.value.append(r.value)
        return result

    def visit_map(self, ctx: Context, mapping: dict[str, Any], depth: int) -> Result:
        return self.visit_plain_map(ctx, mapping, depth)

    def visit_plain_map(self, ctx: Context, mapping: dict[str, Any], depth: int) -> Result:
        if depth == 1:
            return Result(mapping)
        result = Result({})
        for key, item in mapping.items():
            try:
                r = self.evaluate(ctx, item, depth - 1)
            except EvaluationError as exc:
                raise PathError(key, exc) from None
            result.unresolvable.extend(r.unresolvable)
            result.value[key] = r.value
        return result

    def visit_string(self, ctx: Context, text: str, depth: int) -> Result:
        return Result(text)

    def is_plain_map(self, mapping: dict[str, Any]) -> bool:
        """Whether a map of the document is a map of values (not a reference, call, ...)."""
        return True

    def settle(self, ctx: Context, tree: Any) -> Any:
        """`tree` evaluated once, as a value to query: what each part yields is data, which a
        query (run with DEFAULT_EVALUATOR) reads as it is, never as an expression. A part that
        cannot be resolved yet stays in place with what it lacks, and a part that fails keeps
        its error, both for the query to meet only if it goes through them (as relay-core's
        lazy evaluation of a query over a spec would)."""
        if isinstance(tree, list):
            return [self.settle(ctx, item) for item in tree]
        if isinstance(tree, dict) and self.is_plain_map(tree):
            return {key: self.settle(ctx, item) for key, item in tree.items()}
        try:
            result = self.evaluate(ctx, tree, -1)
        except EvaluationError as exc:
            return Failed(exc)
        if not result.complete:
            return StaticExpandable(result.value, result.unresolvable)
        return result.value


DEFAULT_EVALUATOR = Evaluator()


class Evaluated(Expandable):
    """A value some evaluation yielded (a parameter, an output, a function's result) handed
    on to be evaluated again: it is data, and yields itself whichever evaluator meets it."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def expand(self, ctx: Context, depth: int) -> Result:
        return Result(self.value)


class Failed(Expandable):
    """A settled part whose evaluation failed: the error is raised when a walk reaches it."""

    def __init__(self, error: EvaluationError) -> None:
        self.error = error

    def expand(self, ctx: Context, depth: int) -> Result:
        raise self.error


def evaluate_all(ctx: Context, evaluator: Evaluator, tree: Any) -> Result:
    return evaluator.evaluate(ctx, tree, -1)


def combine_list(results: list[Result | None]) -> Result:
    combined = Result([])
    for r in results:
        combined.value.append(None if r is None else r.value)
        if r is not None:
            combined.unresolvable.extend(r.unresolvable)
    return combined


def combine_map(results: dict[str, Result]) -> Result:
    combined = Result({})
    for key, r in results.items():
        combined.value[key] = r.value
        combined.unresolvable.extend(r.unresolvable)
    return combined
