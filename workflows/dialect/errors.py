"""Errors of the expression language and the evaluator."""


class ExpressionError(Exception):
    """An expression or template cannot be parsed."""


class EvaluationError(Exception):
    """Evaluation failed in a way more data will not fix (a type error, an unknown key)."""


class PathError(EvaluationError):
    """An error under a path of the evaluated data ("foo.0.bar")."""

    def __init__(self, path: str, cause: Exception) -> None:
        self.path = path
        self.cause = cause
        parts = [path]
        while isinstance(cause, PathError):
            parts.append(cause.path)
            cause = cause.cause
        self.root_cause = cause
        super().__init__(f'path "{".".join(parts)}": {cause}')


class NotFound(EvaluationError):
    """An index or key that is not there (exists() answers false for these)."""


class UnknownKey(NotFound):
    def __init__(self, key: str) -> None:
        super().__init__(f"unknown key {key}")


class IndexOutOfBounds(NotFound):
    def __init__(self, index: int) -> None:
        super().__init__(f"index {index} out of bounds")


class InvocationError(EvaluationError):
    def __init__(self, name: str, cause: Exception) -> None:
        self.name = name
        self.cause = cause
        super().__init__(f'invocation of function "{name}" failed: {cause}')


class ArgumentError(Exception):
    """A function call cannot be made with these arguments (arity, a missing keyword)."""
