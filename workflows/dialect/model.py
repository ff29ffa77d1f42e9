"""The evaluation model of relay-core's pkg/expr/model: results that say what could not be
resolved yet, values that expand lazily, and the tree walk.

A reference to data that is not there yet (an output of a step still running, a secret not
set) is not an error: the walk leaves the reference in place and lists it in the result's
`unresolvable`. The engine uses that to know when a step is ready.
"""

from abc import ABC, abstractmethod
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from workflows.dialect.budget import Budget
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


_NONE: frozenset[Any] = frozenset()


class Unresolvable:
    """What an evaluation needed and could not get. Each kind is a set of tuples:
    data (name,), secrets (name,), connections (type, name), outputs (from, name),
    parameters (name,), answers (askRef, name), statuses (step,), invocations (function, why).

    An evaluation makes one for every value it walks and nearly all stay empty, so a kind is
    an attribute of the instance only once it holds something (the class's empty set
    otherwise): making one, and asking whether it is empty, cost next to nothing."""

    data: AbstractSet[tuple[str]] = _NONE
    secrets: AbstractSet[tuple[str]] = _NONE
    connections: AbstractSet[tuple[str, str]] = _NONE
    outputs: AbstractSet[tuple[str, str]] = _NONE
    parameters: AbstractSet[tuple[str]] = _NONE
    answers: AbstractSet[tuple[str, str]] = _NONE
    statuses: AbstractSet[tuple[str]] = _NONE
    invocations: AbstractSet[tuple[str, str]] = _NONE

    def __init__(self, **kinds: AbstractSet[Any]) -> None:
        for kind, entries in kinds.items():
            if kind not in UNRESOLVABLE_KINDS:
                raise TypeError(f"no kind {kind!r}")
            if entries:
                self.__dict__[kind] = frozenset(entries)

    def extend(self, other: "Unresolvable") -> None:
        mine = self.__dict__
        for kind, entries in other.__dict__.items():
            mine[kind] = mine[kind] | entries if kind in mine else entries

    def __bool__(self) -> bool:
        return bool(self.__dict__)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Unresolvable) and self.__dict__ == other.__dict__

    def __repr__(self) -> str:
        return "Unresolvable(" + ", ".join(f"{k}={set(v)!r}" for k, v in sorted(self.__dict__.items())) + ")"

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


class Result:
    """A value, and what it still needs (made when first asked for: most need nothing)."""

    __slots__ = ("_unresolvable", "value")

    def __init__(self, value: Any, unresolvable: Unresolvable | None = None) -> None:
        self.value = value
        self._unresolvable = unresolvable

    @property
    def unresolvable(self) -> Unresolvable:
        if self._unresolvable is None:
            self._unresolvable = Unresolvable()
        return self._unresolvable

    @property
    def complete(self) -> bool:
        return not self._unresolvable

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Result)
            and self.value == other.value
            and (self._unresolvable or Unresolvable()) == (other._unresolvable or Unresolvable())
        )

    def __repr__(self) -> str:
        return f"Result({self.value!r}, {self._unresolvable!r})"


@dataclass
class Context:
    """What one evaluation carries: where unresolved references are noted (relay-core keeps
    this in a context.Context), the clock for now(), and the budget it spends (shared by
    every context made from this one)."""

    unresolvable: Unresolvable = field(default_factory=Unresolvable)
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    budget: Budget = field(default_factory=Budget.default)

    def fresh(self) -> "Context":
        return Context(unresolvable=Unresolvable(), clock=self.clock, budget=self.budget)


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
        ctx.budget.spend()
        kind = type(tree)
        if kind in _SCALARS:
            return Result(tree)
        try:
            if kind is str:
                result = self.visit_string(ctx, tree, depth)
                if isinstance(result.value, str):
                    # A walk copies references, not text, but what it returns is as large as
                    # its text: a string shared a thousand times is a thousand copies in JSON.
                    ctx.budget.produce(len(result.value))
            elif isinstance(tree, list):
                result = self.visit_list(ctx, tree, depth)
            elif isinstance(tree, dict):
                result = self.visit_map(ctx, tree, depth)
            elif isinstance(tree, Expandable):
                result = tree.expand(ctx, depth)
            elif isinstance(tree, str):
                result = self.visit_string(ctx, tree, depth)
            else:
                result = Result(tree)
        except EvaluationError:
            raise
        except DATA_ERRORS as exc:
            raise data_error(exc) from exc
        value = result.value
        if not (value is None or isinstance(value, (bool, int, float, str, list, dict, bytes, datetime))):
            raise EvaluationError(
                f"could not evaluate a value of type {type_name(value)}, must be a YAML-compatible type"
            )
        return result

    def visit_list(self, ctx: Context, items: list[Any], depth: int) -> Result:
        if depth == 1:
            return Result(items)
        values: list[Any] = []
        result = Result(values)
        for index, item in enumerate(items):
            try:
                r = self.evaluate(ctx, item, depth - 1)
            except EvaluationError as exc:
                raise PathError(str(index), exc) from None
            if r._unresolvable:
                result.unresolvable.extend(r._unresolvable)
            values.append(r.value)
        return result

    def visit_map(self, ctx: Context, mapping: dict[str, Any], depth: int) -> Result:
        return self.visit_plain_map(ctx, mapping, depth)

    def visit_plain_map(self, ctx: Context, mapping: dict[str, Any], depth: int) -> Result:
        if depth == 1:
            return Result(mapping)
        values: dict[str, Any] = {}
        result = Result(values)
        for key, item in mapping.items():
            try:
                r = self.evaluate(ctx, item, depth - 1)
            except EvaluationError as exc:
                raise PathError(key, exc) from None
            if r._unresolvable:
                result.unresolvable.extend(r._unresolvable)
            values[key] = r.value
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
_SCALARS = frozenset({type(None), bool, int, float})

# What evaluating data can raise besides EvaluationError: Python's limits where Go has none
# or fails otherwise (a number too large, a text too long to convert, nesting too deep).
DATA_ERRORS = (ArithmeticError, ValueError, TypeError, LookupError, AttributeError, RecursionError)


def data_error(exc: Exception) -> EvaluationError:
    """One of DATA_ERRORS raised while evaluating, as an EvaluationError: the evaluation
    cannot be done with this data, and trying again will not help."""
    if isinstance(exc, EvaluationError):
        return exc
    if isinstance(exc, RecursionError):
        return EvaluationError("the value nests too deeply")
    text = str(exc)
    text = text if len(text) <= 200 else text[:200] + "…"
    return EvaluationError(f"the value cannot be evaluated ({type(exc).__name__}: {text})")


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
        if r is not None and r._unresolvable:  # (most need nothing: no Unresolvable made)
            combined.unresolvable.extend(r._unresolvable)
    return combined


def combine_map(results: dict[str, Result]) -> Result:
    combined = Result({})
    for key, r in results.items():
        combined.value[key] = r.value
        if r._unresolvable:
            combined.unresolvable.extend(r._unresolvable)
    return combined
