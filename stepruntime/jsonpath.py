"""The `jsonpath` and `jsonpath-template` query languages of relay-core's GET /spec (leg's
jsonutil jsonpath/template: kubectl's JSONPath templates), which `ni get -p '{.path}'` uses.

A template is text with `{…}` parts: a path (`.a.b`, `$.a`, `a`, `['k']`, `[0]`, `[-1]`,
`[*]`, `.*`, `..name`, `[1:3]`, `[0,2]`), a quoted string (`{"\\n"}`), or
`{range <path>}…{end}`. Its value is always a string: each part formatted as Go's `%v`,
nothing for a missing key or null, and the elements of a list joined with spaces. A lone
path (`jsonpath`) yields the value itself (a list where the path can match several).

What is not here (a 422 says so): filters (`[?(@.x == 1)]`) and scripts. A query runs over
a settled spec (Evaluator.settle): its values are data, read as they are; a part that cannot
be resolved yet (or fails) counts only where the path goes through it.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workflows.dialect.errors import EvaluationError
from workflows.dialect.model import DEFAULT_EVALUATOR, Context, Result, evaluate_all
from workflows.dialect.values import sprint


class QueryError(EvaluationError):
    """The query cannot be read, or uses what is not supported."""


# A path is a list of selectors; each maps one value to the values it selects.
Selector = Callable[[Any], list[Any]]


@dataclass
class _Path:
    selectors: list[tuple[str, Any]]  # (kind, argument)
    plural: bool  # can match several values (wildcards, slices, unions, descent)


@dataclass
class _Range:
    path: _Path
    body: list[Any]


@dataclass
class Template:
    parts: list[Any] = field(default_factory=list)  # str, _Path or _Range


_NAME = re.compile(r"[^\s.\[\]{}()'\"=!<>,*@$?&|]+")


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def error(self, what: str) -> QueryError:
        return QueryError(f"the JSONPath query cannot be read at column {self.pos + 1}: {what}")

    def peek(self, n: int = 1) -> str:
        return self.text[self.pos : self.pos + n]

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def template(self, inner: bool = False) -> list[Any]:
        parts: list[Any] = []
        while self.pos < len(self.text):
            brace = self.text.find("{", self.pos)
            if brace < 0:
                parts.append(self.text[self.pos :])
                self.pos = len(self.text)
                break
            if brace > self.pos:
                parts.append(self.text[self.pos : brace])
            self.pos = brace + 1
            self.skip_space()
            if self.text.startswith("end", self.pos) and self._word_end(3):
                if not inner:
                    raise self.error("{end} without {range}")
                self.pos += 3
                self.close()
                return parts
            if self.text.startswith("range", self.pos) and self._word_end(5):
                self.pos += 5
                path = self.path()
                self.close()
                parts.append(_Range(path, self.template(inner=True)))
                continue
            if self.peek() in ("'", '"'):
                parts.append(self.string())
            else:
                parts.append(self.path())
            self.close()
        if inner:
            raise self.error("{range} without {end}")
        return parts

    def _word_end(self, length: int) -> bool:
        following = self.text[self.pos + length : self.pos + length + 1]
        return following == "" or following.isspace() or following == "}"

    def close(self) -> None:
        self.skip_space()
        if self.peek() != "}":
            raise self.error("expected '}'")
        self.pos += 1

    def string(self) -> str:
        quote = self.text[self.pos]
        self.pos += 1
        out = []
        while self.pos < len(self.text):
            char = self.text[self.pos]
            self.pos += 1
            if char == quote:
                return "".join(out)
            if char == "\\" and self.pos < len(self.text):
                escaped = self.text[self.pos]
                self.pos += 1
                out.append({"n": "\n", "t": "\t", "r": "\r"}.get(escaped, escaped))
            else:
                out.append(char)
        raise self.error("unterminated string")

    def path(self) -> _Path:
        self.skip_space()
        selectors: list[tuple[str, Any]] = []
        plural = False
        if self.peek() in ("$", "@"):
            self.pos += 1
        elif (match := _NAME.match(self.text, self.pos)) is not None:
            selectors.append(("key", match.group()))  # a leading name: WithInitialPath
            self.pos = match.end()
        while self.pos < len(self.text):
            char = self.peek()
            if self.peek(2) == "..":
                self.pos += 2
                plural = True
                if self.peek() == "*":
                    self.pos += 1
                    selectors.append(("descend", None))
                    continue
                match = _NAME.match(self.text, self.pos)
                if match is None:
                    raise self.error("expected a name after '..'")
                selectors.append(("descend", match.group()))
                self.pos = match.end()
            elif char == ".":
                self.pos += 1
                if self.peek() == "*":
                    self.pos += 1
                    selectors.append(("all", None))
                    plural = True
                    continue
                match = _NAME.match(self.text, self.pos)
                if match is None:
                    if self.peek() in ("}", ""):
                        continue  # `{.}`: the value itself
                    raise self.error("expected a name after '.'")
                selectors.append(("key", match.group()))
                self.pos = match.end()
            elif char == "[":
                self.pos += 1
                kind, argument = self.bracket()
                plural = plural or kind in ("all", "slice", "union")
                selectors.append((kind, argument))
            else:
                break
        return _Path(selectors, plural)

    def bracket(self) -> tuple[str, Any]:
        self.skip_space()
        if self.peek() == "?" or self.peek() == "(":
            raise self.error("filters and scripts are not supported here")
        items: list[Any] = []
        while True:
            self.skip_space()
            if self.peek() == "*":
                self.pos += 1
                items.append(("all",))
            elif self.peek() in ("'", '"'):
                items.append(("key", self.string()))
            else:
                match = re.compile(r"(-?\d*)\s*(?::\s*(-?\d*))?(?:\s*:\s*(-?\d*))?").match(
                    self.text, self.pos
                )
                assert match is not None  # the pattern matches the empty string
                if not match.group():
                    raise self.error("expected an index, a quoted key, '*' or a slice")
                self.pos = match.end()
                start, stop, step = match.groups()
                if ":" in match.group():
                    items.append(("slice", _int(start), _int(stop), _int(step)))
                else:
                    items.append(("index", int(start)))
            self.skip_space()
            if self.peek() == ",":
                self.pos += 1
                continue
            if self.peek() != "]":
                raise self.error("expected ']'")
            self.pos += 1
            break
        if len(items) == 1:
            item = items[0]
            if item[0] == "all":
                return "all", None
            if item[0] == "slice":
                return "slice", item[1:]
            return item[0], item[1]
        return "union", items


def _int(text: str | None) -> int | None:
    return int(text) if text not in (None, "") else None


def parse_template(text: str) -> Template:
    return Template(_Parser(text).template())


def parse_path(text: str) -> _Path:
    parser = _Parser(text.strip())
    if parser.peek() == "{" and parser.text.endswith("}"):
        parser = _Parser(parser.text[1:-1].strip())  # kubectl's braces, tolerated
    path = parser.path()
    parser.skip_space()
    if parser.pos != len(parser.text):
        raise parser.error("unexpected text after the path")
    return path


class _Walker:
    """Selects from a settled value: each value is expanded one level before it is looked
    into (a part that cannot be resolved yet is noted and selects nothing; one that failed
    raises its error)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def expand(self, value: Any) -> tuple[bool, Any]:
        result = DEFAULT_EVALUATOR.evaluate(self.ctx, value, 1)
        if not result.complete:
            self.ctx.unresolvable.extend(result.unresolvable)
            return False, None
        return True, result.value

    def select(self, path: _Path, root: Any) -> list[Any]:
        values = [root]
        for kind, argument in path.selectors:
            selected: list[Any] = []
            for value in values:
                selected += self.step(kind, argument, value)
            values = selected
        return values

    def step(self, kind: str, argument: Any, value: Any) -> list[Any]:
        ok, value = self.expand(value)
        if not ok:
            return []
        if kind == "key":
            return [value[argument]] if isinstance(value, dict) and argument in value else []
        if kind == "index":
            if isinstance(value, list) and -len(value) <= argument < len(value):
                return [value[argument]]
            return []
        if kind == "all":
            if isinstance(value, dict):
                return [value[k] for k in sorted(value)]
            return list(value) if isinstance(value, list) else []
        if kind == "slice":
            start, stop, step = argument
            if step == 0:
                raise QueryError("a slice's step cannot be 0")
            return list(value[start:stop:step]) if isinstance(value, list) else []
        if kind == "union":
            out: list[Any] = []
            for item in argument:
                out += self.step(item[0], item[1] if len(item) == 2 else item[1:], value)
            return out
        if kind == "descend":
            return self.descend(argument, value)
        raise AssertionError(kind)

    def descend(self, name: str | None, value: Any) -> list[Any]:
        out: list[Any] = []
        if isinstance(value, dict):
            if name is None:
                out += [value[k] for k in sorted(value)]
            elif name in value:
                out.append(value[name])
            children = [value[k] for k in sorted(value)]
        elif isinstance(value, list):
            if name is None:
                out += value
            children = value
        else:
            return out
        for child in children:
            ok, child = self.expand(child)
            if ok:
                out += self.descend(name, child)
        return out

    def finish(self, value: Any) -> Any:
        result = evaluate_all(self.ctx, DEFAULT_EVALUATOR, value)
        self.ctx.unresolvable.extend(result.unresolvable)
        return result.value

    def format(self, value: Any) -> str:
        value = self.finish(value)
        if value is None:
            return ""
        if isinstance(value, list):
            return " ".join(sprint(v) for v in value)
        return sprint(value)

    def render(self, parts: list[Any], root: Any) -> str:
        out = []
        for part in parts:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, _Path):
                matches = self.select(part, root)
                out.append(self.format(matches if part.plural else (matches[0] if matches else None)))
            else:
                candidate = self.select(part.path, root)
                items = candidate if part.path.plural else (candidate[0] if candidate else None)
                ok, items = self.expand(items)
                if ok and isinstance(items, list):
                    out += [self.render(part.body, item) for item in items]
        return "".join(out)


def evaluate_template(tree: Any, query: str) -> Result:
    """`jsonpath-template`: always a string."""
    ctx = Context()
    template = parse_template(query)
    walker = _Walker(ctx)
    value = walker.render(template.parts, tree)
    return Result(value, ctx.unresolvable)


def evaluate_path(tree: Any, query: str) -> Result:
    """`jsonpath`: the value the path selects (a list where it can select several)."""
    ctx = Context()
    path = parse_path(query)
    walker = _Walker(ctx)
    matches = walker.select(path, tree)
    value = walker.finish(matches if path.plural else (matches[0] if matches else None))
    return Result(value, ctx.unresolvable)
