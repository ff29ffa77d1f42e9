"""What one evaluation may spend, counted as it goes.

The language has no loops, but a value can double at each level (`jsonMarshal` of a
string of quotes, `concat($, $)` in a pipe, `[$, $]` shared and then walked), so a few
hundred bytes of document can ask for gigabytes. Every evaluation carries a Budget (in its
Context) and each place that builds or walks a value charges it *before* the work is done,
so an evaluation stops at its budget, never after:

- steps: expression nodes, function calls, and every item a walk visits (the evaluator's,
  JSON and text forms, comparisons, copies);
- characters: every character a value is built from (strings made, and string leaves a walk
  copies into its result, so a string shared many times counts each time);
- the largest value: no string built may be longer than `value_chars` characters.

Exceeding any of them raises BudgetExceeded, an EvaluationError: a 400 at the expression's
pointer when a document is validated, a step that ends `failure` at run time, a 422 from the
step runtime API.
"""

from dataclasses import dataclass

from workflows.dialect.errors import EvaluationError

# The defaults, for code that runs without Django's settings (they are the settings' defaults).
MAX_STEPS = 500_000
MAX_CHARS = 64 * 1024 * 1024
MAX_VALUE_CHARS = 4 * 1024 * 1024
VALIDATE_MAX_STEPS = 200_000
VALIDATE_MAX_CHARS = 16 * 1024 * 1024


class BudgetExceeded(EvaluationError):
    """The evaluation would spend more than its budget."""


@dataclass
class Budget:
    steps: int = MAX_STEPS  # left
    chars: int = MAX_CHARS  # left
    value_chars: int = MAX_VALUE_CHARS  # the most for one value
    # What the limits were, for the message (a shared budget may start with less left).
    total_steps: int = MAX_STEPS
    total_chars: int = MAX_CHARS
    what: str = "the expression"

    @classmethod
    def default(cls) -> "Budget":
        """One evaluation's budget, from the settings (EXPRESSION_MAX_*)."""
        steps, chars, value_chars = _settings()
        return cls(steps, chars, value_chars, steps, chars)

    @classmethod
    def for_validation(cls) -> "Budget":
        """What the dry runs of one document's constant expressions spend together
        (EXPRESSION_VALIDATE_MAX_STEPS and _CHARS): validating a document is quick, whatever
        it holds. A value may be as large as at run time."""
        _, _, value_chars = _settings()
        steps = _setting("EXPRESSION_VALIDATE_MAX_STEPS", VALIDATE_MAX_STEPS)
        chars = _setting("EXPRESSION_VALIDATE_MAX_CHARS", VALIDATE_MAX_CHARS)
        return cls(steps, chars, value_chars, steps, chars, "the document's constant expressions, together,")

    def spend(self, steps: int = 1) -> None:
        self.steps -= steps
        if self.steps < 0:
            raise BudgetExceeded(
                f"{self.what} takes more than {self.total_steps:,} steps to evaluate (the evaluation budget)"
            )

    def check_value(self, chars: int) -> None:
        """A value of `chars` characters is about to be built: refused when too large."""
        if chars > self.value_chars:
            raise BudgetExceeded(
                f"a value would be over {self.value_chars:,} characters (the largest an evaluation may build)"
            )

    def produce(self, chars: int) -> None:
        """`chars` characters are about to be built (or copied) into one value."""
        self.check_value(chars)
        self.take_chars(chars)

    def take_chars(self, chars: int) -> None:
        self.chars -= chars
        if self.chars < 0:
            raise BudgetExceeded(
                f"{self.what} builds more than {self.total_chars:,} characters in all (the evaluation budget)"
            )


def exceeded(exc: BaseException | None) -> "BudgetExceeded | None":
    """The budget exceeded that `exc` is or was caused by (errors wrap their causes)."""
    for _ in range(100):
        if exc is None or isinstance(exc, BudgetExceeded):
            return exc
        exc = getattr(exc, "cause", None) or exc.__cause__
    return None


def _settings() -> tuple[int, int, int]:
    return (
        _setting("EXPRESSION_MAX_STEPS", MAX_STEPS),
        _setting("EXPRESSION_MAX_CHARS", MAX_CHARS),
        _setting("EXPRESSION_MAX_VALUE_CHARS", MAX_VALUE_CHARS),
    )


def _setting(name: str, default: int) -> int:
    try:
        from django.conf import settings
        from django.core.exceptions import ImproperlyConfigured
    except ImportError:
        return default
    try:
        return int(getattr(settings, name, default))
    except ImproperlyConfigured:  # a script using the dialect without Django's settings
        return default
