"""Relay's function library (relay-core pkg/expr/fnlib), callable as `!Fn.name [...]`,
`!Fn.name {...}` or `${name(...)}`.

A function receives its arguments unevaluated and evaluates what it needs: `coalesce` skips
arguments that cannot be resolved yet, `path` and `exists` turn a missing key into a default
or `false`. Wrong arity or a missing keyword leaves the call unresolvable (as relay-core
does); a wrong argument type is an error.
"""

import re
from collections.abc import Callable
from typing import Any

from workflows.dialect import expr
from workflows.dialect.budget import Budget
from workflows.dialect.errors import ArgumentError, EvaluationError, NotFound
from workflows.dialect.fn import Descriptor, Invoker
from workflows.dialect.model import Context, Evaluator, Result, combine_list, combine_map, evaluate_all
from workflows.dialect.values import deep_equal, from_json, to_json, to_string, type_name


def arity(got: int, *wanted: int, variadic: bool = False) -> ArgumentError:
    more = " or more" if variadic else ""
    return ArgumentError(
        f"fn: unexpected number of arguments: {got} (wanted {', '.join(str(w) for w in wanted)}{more})"
    )


def unexpected_type(got: Any, wanted: str) -> EvaluationError:
    return EvaluationError(f"fn: unexpected type {type_name(got)} (wanted {wanted})")


def arg_error(arg: int | str, cause: Exception) -> EvaluationError:
    label = f'"{arg}"' if isinstance(arg, str) else str(arg)
    error = EvaluationError(f"fn: arg {label}: {cause}")
    error.cause = cause  # type: ignore[attr-defined]  # what budget.exceeded() follows
    return error


def evaluated_positional(
    evaluator: Evaluator, args: list[Any], fn: Callable[[Context, list[Any]], Any]
) -> Invoker:
    def invoke(ctx: Context) -> Result:
        result = combine_list([evaluate_all(ctx, evaluator, arg) for arg in args])
        if not result.complete:
            return result
        return Result(fn(ctx, result.value))

    return invoke


def evaluated_keyword(
    evaluator: Evaluator, args: dict[str, Any], fn: Callable[[Context, dict[str, Any]], Any]
) -> Invoker:
    def invoke(ctx: Context) -> Result:
        result = combine_map({key: evaluate_all(ctx, evaluator, arg) for key, arg in args.items()})
        if not result.complete:
            return result
        return Result(fn(ctx, result.value))

    return invoke


def static(value: Any) -> Invoker:
    return lambda ctx: Result(value)


# append ---------------------------------------------------------------------------------------


def _append(evaluator: Evaluator, args: list[Any]) -> Invoker:
    if len(args) < 2:
        raise arity(len(args), 2, variadic=True)

    def fn(ctx: Context, values: list[Any]) -> Any:
        if not isinstance(values[0], list):
            raise arg_error(1, unexpected_type(values[0], "[]interface {}"))
        ctx.budget.spend(len(values[0]) + len(values))
        return [*values[0], *values[1:]]

    return evaluated_positional(evaluator, args, fn)


# coalesce -------------------------------------------------------------------------------------


def _coalesce(evaluator: Evaluator, args: list[Any]) -> Invoker:
    def invoke(ctx: Context) -> Result:
        for arg in args:
            result = evaluate_all(ctx, evaluator, arg)
            if result.complete and result.value is not None:
                return result
        return Result(None)

    return invoke


# concat ---------------------------------------------------------------------------------------


def _concat(evaluator: Evaluator, args: list[Any]) -> Invoker:
    if not args:
        return static("")

    def fn(ctx: Context, values: list[Any]) -> Any:
        parts = []
        for index, value in enumerate(values):
            try:
                parts.append(to_string(value))
            except EvaluationError as exc:
                raise arg_error(index + 1, exc) from None
        ctx.budget.produce(sum(len(part) for part in parts))
        return "".join(parts)

    return evaluated_positional(evaluator, args, fn)


# convertMarkdown -------------------------------------------------------------------------------

_JIRA_RULE = re.compile(r"(^|\s+)(-\s*-\s*-)(\s+|$)")


def convert_markdown(to: str, content: str) -> str:
    """Markdown to `html` (CommonMark) or `jira` (relay-core's renderer: text, inline code,
    links and images only)."""
    from markdown_it import MarkdownIt

    if to == "html":
        return MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(content)
    if to != "jira":
        raise EvaluationError("convert: type not supported")
    tokens = MarkdownIt("commonmark").parse(content)
    out: list[str] = []
    for block in tokens:
        if block.type == "inline" and block.children:
            _jira_inline(block.children, out)
    return "".join(out)


def _jira_inline(children: list[Any], out: list[str]) -> None:
    parents: list[str] = []  # "link" or "image" around the current token
    links: list[str] = []
    pending_text: list[str] = []

    def flush() -> None:
        if not pending_text:
            return
        text = "".join(pending_text)
        pending_text.clear()
        if parents and parents[-1] == "link":
            if text:
                out.append("[" + text)
            return
        text = _JIRA_RULE.sub("\n----\n", text)
        text = text.removeprefix("%%% ").removesuffix(" %%%")
        out.append(text)

    for token in children:
        if token.type in ("text", "softbreak", "hardbreak"):
            pending_text.append(token.content if token.type == "text" else "\n")
            continue
        flush()
        if token.type == "code_inline":
            out.append("{code}" + token.content + "{code}")
        elif token.type == "link_open":
            parents.append("link")
            links.append(str(token.attrGet("href") or ""))
        elif token.type == "link_close":
            parents.pop()
            out.append("|" + links.pop() + "]")
        elif token.type == "image":
            # gomarkdown gives an image its alt text as a child: it renders as two newlines.
            if token.children:
                out.append("\n\n")
            if parents and parents[-1] == "link":
                out.append("[")
            out.append("!" + str(token.attrGet("src") or "") + "!")
    flush()


def _convert(ctx: Context, to: str, content: str) -> str:
    ctx.budget.spend(len(content) * MARKDOWN_STEPS_PER_CHAR + 1)
    converted = convert_markdown(to, content)
    ctx.budget.produce(len(converted))
    return converted


# markdown-it is Python: 3 to 15 µs a character of input (the most for runs of `[`), where
# an evaluator's step is about 1 µs.
MARKDOWN_STEPS_PER_CHAR = 8


def _convert_markdown_positional(evaluator: Evaluator, args: list[Any]) -> Invoker:
    if len(args) != 2:
        raise arity(len(args), 2)

    def fn(ctx: Context, values: list[Any]) -> Any:
        if not isinstance(values[0], str):
            raise arg_error(0, unexpected_type(values[0], "string"))
        if not isinstance(values[1], str):
            raise arg_error(1, unexpected_type(values[1], "string"))
        return _convert(ctx, values[0], values[1])

    return evaluated_positional(evaluator, args, fn)


def _convert_markdown_keyword(evaluator: Evaluator, args: dict[str, Any]) -> Invoker:
    for name in ("to", "content"):
        if name not in args:
            raise ArgumentError(f'fn: arg "{name}": fn: arg not found')

    def fn(ctx: Context, values: dict[str, Any]) -> Any:
        if not isinstance(values["to"], str):
            raise arg_error("to", unexpected_type(values["to"], "string"))
        if not isinstance(values["content"], str):
            raise arg_error("content", unexpected_type(values["content"], "string"))
        return _convert(ctx, values["to"], values["content"])

    return evaluated_keyword(evaluator, args, fn)


# equals, notEquals -----------------------------------------------------------------------------


def _comparison(negate: bool) -> Callable[[Evaluator, list[Any]], Invoker]:
    def positional(evaluator: Evaluator, args: list[Any]) -> Invoker:
        if len(args) != 2:
            raise arity(len(args), 2)
        return evaluated_positional(
            evaluator, args, lambda ctx, v: deep_equal(v[0], v[1], ctx.budget) != negate
        )

    return positional


# exists ---------------------------------------------------------------------------------------


def is_not_found(exc: BaseException | None) -> bool:
    while exc is not None:
        if isinstance(exc, NotFound):
            return True
        exc = getattr(exc, "cause", None)
    return False


def _exists(evaluator: Evaluator, args: list[Any]) -> Invoker:
    if len(args) != 1:
        raise arity(len(args), 1)

    def invoke(ctx: Context) -> Result:
        try:
            result = evaluate_all(ctx, evaluator, args[0])
        except EvaluationError as exc:
            if is_not_found(exc):
                return Result(False)
            raise
        if not result.complete:
            return combine_list([result])
        return Result(True)

    return invoke


# jsonMarshal, jsonUnmarshal --------------------------------------------------------------------


def _json_marshal(evaluator: Evaluator, args: list[Any]) -> Invoker:
    if len(args) != 1:
        raise arity(len(args), 1)

    def fn(ctx: Context, values: list[Any]) -> Any:
        try:
            return to_json(values[0], budget=ctx.budget)
        except EvaluationError as exc:
            raise arg_error(1, exc) from None

    return evaluated_positional(evaluator, args, fn)


def _json_unmarshal(evaluator: Evaluator, args: list[Any]) -> Invoker:
    if len(args) != 1:
        raise arity(len(args), 1)

    def fn(ctx: Context, values: list[Any]) -> Any:
        if not isinstance(values[0], str):
            raise arg_error(1, unexpected_type(values[0], "string"))
        try:
            return from_json(values[0])
        except ValueError as exc:
            raise EvaluationError(f"the text is not JSON: {exc}") from None

    return evaluated_positional(evaluator, args, fn)


# merge ----------------------------------------------------------------------------------------


def merge_into(target: dict[str, Any], source: dict[str, Any], deep: bool, budget: Budget) -> None:
    for key, value in source.items():
        budget.spend()
        if deep and isinstance(target.get(key), dict) and isinstance(value, dict):
            merge_into(target[key], value, deep, budget)
            continue
        target[key] = _copy(value, budget) if isinstance(value, (dict, list)) else value


def _copy(value: Any, budget: Budget) -> Any:
    """copy.deepcopy, counted: a value shared many times is copied as many times."""
    budget.spend()
    if isinstance(value, dict):
        return {key: _copy(item, budget) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy(item, budget) for item in value]
    return value


def _merge_positional(evaluator: Evaluator, args: list[Any]) -> Invoker:
    if not args:
        return static({})

    def fn(ctx: Context, values: list[Any]) -> Any:
        merged: dict[str, Any] = {}
        for index, value in enumerate(values):
            if not isinstance(value, dict):
                raise arg_error(index + 1, unexpected_type(value, "map[string]interface {}"))
        for value in values:
            merge_into(merged, value, True, ctx.budget)
        return merged

    return evaluated_positional(evaluator, args, fn)


def _merge_keyword(evaluator: Evaluator, args: dict[str, Any]) -> Invoker:
    if "objects" not in args:
        raise ArgumentError('fn: arg "objects": fn: arg not found')

    def fn(ctx: Context, values: dict[str, Any]) -> Any:
        mode = values.get("mode", "deep")
        if mode not in ("deep", "shallow") or not isinstance(mode, str):
            shown = f'"{mode}"' if isinstance(mode, str) else to_json(mode, budget=ctx.budget)
            shown = shown if len(shown) <= 200 else shown[:200] + "…"
            raise arg_error(
                "mode", EvaluationError(f'unexpected value {shown}, wanted one of "deep" or "shallow"')
            )
        objects = values["objects"]
        if not isinstance(objects, list):
            raise arg_error("objects", unexpected_type(objects, "[]interface {}"))
        for index, value in enumerate(objects):
            if not isinstance(value, dict):
                raise arg_error(
                    "objects",
                    EvaluationError(
                        f"array index {index}: {unexpected_type(value, 'map[string]interface {}')}"
                    ),
                )
        merged: dict[str, Any] = {}
        for value in objects:
            merge_into(merged, value, mode == "deep", ctx.budget)
        return merged

    return evaluated_keyword(evaluator, args, fn)


# now ------------------------------------------------------------------------------------------


def _now(evaluator: Evaluator, args: list[Any]) -> Invoker:
    if args:
        raise arity(len(args), 0)
    return lambda ctx: Result(ctx.clock())


# path -----------------------------------------------------------------------------------------


class _PathArg:
    def __init__(self, value: Any) -> None:
        self.value = value
        self.result: Result | None = None
        self.error: Exception | None = None


def _path(
    ctx: Context, evaluator: Evaluator, obj: _PathArg, query: _PathArg, default: _PathArg | None
) -> Result | None:
    for arg in (obj, query, default):
        if arg is not None:
            arg.result = Result(arg.value)
    default_usable = default is not None
    try:
        query.result = evaluate_all(ctx, evaluator, query.value)
    except EvaluationError as exc:
        query.error = exc
        return None
    if not query.result.complete:
        return None
    text = query.result.value
    if not isinstance(text, str):
        query.error = unexpected_type(text, "string")
        return None
    try:
        # The object is evaluated once and the query reads the value it yields as data (a
        # string in a parameter is text, not a template to evaluate again).
        found = expr.evaluate_query(ctx, evaluator.settle(ctx, obj.value), text)
    except EvaluationError as exc:
        obj.error = exc
        if not is_not_found(exc):
            default_usable = False
    else:
        if found.complete:
            return found
        # Only the part that could not be resolved is reported, not the whole object.
        assert obj.result is not None
        obj.result.unresolvable.extend(found.unresolvable)
        return None
    if not default_usable or default is None:
        return None
    obj.error = None
    try:
        default.result = evaluate_all(ctx, evaluator, default.value)
    except EvaluationError as exc:
        default.error = exc
        return None
    if not default.result.complete:
        return None
    return default.result


def _path_positional(evaluator: Evaluator, args: list[Any]) -> Invoker:
    if not 2 <= len(args) <= 3:
        raise arity(len(args), 2, 3)

    def invoke(ctx: Context) -> Result:
        parts = [_PathArg(args[0]), _PathArg(args[1]), _PathArg(args[2]) if len(args) > 2 else None]
        found = _path(ctx, evaluator, parts[0], parts[1], parts[2])  # type: ignore[arg-type]
        if found is not None:
            return found
        results: list[Result | None] = []
        for index, part in enumerate(parts):
            if part is None:
                continue
            if part.error is not None:
                raise arg_error(index + 1, part.error)
            results.append(part.result)
        return combine_list(results)

    return invoke


def _path_keyword(evaluator: Evaluator, args: dict[str, Any]) -> Invoker:
    for name in ("object", "query"):
        if name not in args:
            raise ArgumentError(f'fn: arg "{name}": fn: arg not found')

    def invoke(ctx: Context) -> Result:
        parts = {
            "object": _PathArg(args["object"]),
            "query": _PathArg(args["query"]),
            "default": _PathArg(args["default"]) if "default" in args else None,
        }
        found = _path(ctx, evaluator, parts["object"], parts["query"], parts["default"])  # type: ignore[arg-type]
        if found is not None:
            return found
        results: dict[str, Result] = {}
        for name, part in parts.items():
            if part is None:
                continue
            if part.error is not None:
                raise arg_error(name, part.error)
            assert part.result is not None
            results[name] = part.result
        return combine_map(results)

    return invoke


# toString -------------------------------------------------------------------------------------


def _to_string(evaluator: Evaluator, args: list[Any]) -> Invoker:
    if len(args) != 1:
        raise arity(len(args), 1)

    def fn(ctx: Context, values: list[Any]) -> Any:
        try:
            return to_string(values[0])
        except EvaluationError as exc:
            raise arg_error(1, exc) from None

    return evaluated_positional(evaluator, args, fn)


LIBRARY: dict[str, Descriptor] = {
    "append": Descriptor("Adds new items to a given array, returning a new array", _append),
    "coalesce": Descriptor(
        "Finds and returns the first resolvable non-null argument, returning null otherwise", _coalesce
    ),
    "concat": Descriptor("Concatenates string arguments into a single string", _concat),
    "convertMarkdown": Descriptor(
        "Converts a string in markdown format to another applicable syntax",
        _convert_markdown_positional,
        _convert_markdown_keyword,
    ),
    "equals": Descriptor("Checks if the left side equals the right side", _comparison(negate=False)),
    "exists": Descriptor("Determines whether a value is set", _exists),
    "jsonMarshal": Descriptor("Marshals arbitrary data into a JSON-encoded string", _json_marshal),
    "jsonUnmarshal": Descriptor("Unmarshals a JSON-encoded string into the specification", _json_unmarshal),
    "merge": Descriptor(
        "Merges a series of objects, with each object overwriting prior entries",
        _merge_positional,
        _merge_keyword,
    ),
    "notEquals": Descriptor(
        "Checks if the left side does not equal the right side", _comparison(negate=True)
    ),
    "now": Descriptor("Retrieves the current system time in UTC", _now),
    "path": Descriptor(
        "Looks up a value at a given path in an object, "
        "optionally returning a default value if the path does not exist",
        _path_positional,
        _path_keyword,
    ),
    "toString": Descriptor("Converts arbitrary scalar input data to a string", _to_string),
}
