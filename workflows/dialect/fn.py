"""A function as an expression calls it (relay-core's pkg/expr/fn): its description and how it
takes positional or keyword arguments. The functions themselves are in fnlib.py; this stands
apart so that the expression language (expr.py) can name the type without importing them."""

from collections.abc import Callable
from typing import Any

from workflows.dialect.errors import ArgumentError
from workflows.dialect.model import Context, Evaluator, Result

Invoker = Callable[[Context], Result]


class Descriptor:
    def __init__(
        self,
        description: str,
        positional: Callable[[Evaluator, list[Any]], Invoker] | None = None,
        keyword: Callable[[Evaluator, dict[str, Any]], Invoker] | None = None,
    ) -> None:
        self.description = description
        self._positional = positional
        self._keyword = keyword

    def positional(self, evaluator: Evaluator, args: list[Any]) -> Invoker:
        if self._positional is None:
            raise ArgumentError("fn: positional arguments cannot be used")
        return self._positional(evaluator, args)

    def keyword(self, evaluator: Evaluator, args: dict[str, Any]) -> Invoker:
        if self._keyword is None:
            raise ArgumentError("fn: keyword arguments cannot be used")
        return self._keyword(evaluator, args)
