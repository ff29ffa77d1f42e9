"""Relay's expression language (relay-core pkg/expr/pathlang on PaesslerAG/gval) and its
`${…}` templates.

Expressions: literals (numbers are float64; "…", '…' and `…` strings; true, false, null;
[…] and {…}), paths (`a.b`, `a['b']`, `a.0`, `a[1 + 1]`, `a.'x y'`, `a.(expr)`, `$` for the
root), function calls (`f(x, y)` or `f(k: x, l: y)`), prefix `- ! ~`, infix operators with
gval's precedences and conversions (`** * / % + - << >> & | ^ == != < <= > >= =~ !~ && ||`),
and the pipe `|>`, which evaluates its right side against the value of its left side.
Identifiers may contain `-` after the first character: `a-b` is one name, `a - b` a
subtraction.

A template is text with `${expression}` parts. A template that is one expression yields the
expression's value with its type; otherwise the parts are joined as text (maps and lists as
indented JSON, as relay-core does).
"""

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple

from workflows.dialect.budget import Budget
from workflows.dialect.errors import (
    ArgumentError,
    EvaluationError,
    ExpressionError,
    IndexOutOfBounds,
    InvocationError,
    PathError,
    UnknownKey,
)
from workflows.dialect.model import (
    DATA_ERRORS,
    DEFAULT_EVALUATOR,
    Context,
    Evaluator,
    Expandable,
    Indexable,
    Result,
    StaticExpandable,
    Unresolvable,
    data_error,
    evaluate_all,
    unresolved,
)
from workflows.dialect.values import (
    deep_equal,
    format_float,
    format_time,
    is_number,
    sprint,
    to_json,
    type_name,
)

if TYPE_CHECKING:
    from workflows.dialect.fn import Descriptor

MAX_EXPRESSION_CHARS = 64 * 1024
MAX_NESTING = 64

# ---------------------------------------------------------------------------------------------
# Scanner (Go's text/scanner as gval configures it)

IDENT, NUMBER, STRING, CHAR, RAW, EOF = "ident", "number", "string", "char", "raw", "eof"
OPERATOR_CHARS = set("+-*/%><=!^&|~")
_OPERATOR_RUN = re.compile(r"[-+*/%><=!^&|~]*")
_NUMBER = re.compile(
    r"0[xX][0-9a-fA-F_]*(?:\.[0-9a-fA-F_]*)?(?:[pP][+-]?[0-9_]+)?|0[bBoO][0-9_]*"
    r"|(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)(?:[eE][+-]?[0-9_]+)?"
)
_INT = re.compile(r"0[xXbBoO][0-9a-fA-F_]*|[0-9][0-9_]*")


# One compiled pattern reads the space before a token and the common tokens in ASCII (a
# 1 MiB document holds some 600,000 tokens); the character-by-character rules below take the
# rest (names in other alphabets, strings that do not end, single characters), and say the
# same for ASCII. `floats`: whether `1.5` is one number (not after a path's `.`).
_SPACE = r"(?:[ \t\n\r]+|//[^\n]*|/\*.*?(?:\*/|\Z))*"
_COMMON = (
    r"(?P<ident>[A-Za-z_][A-Za-z0-9_-]*)|(?P<number>{number})"
    r"""|(?P<string>"(?:[^"\\\n]|\\[^\n])*")|(?P<char>'(?:[^'\\\n]|\\[^\n])*')|(?P<raw>`[^`]*`)"""
)
_TOKEN = {
    floats: re.compile(f"{_SPACE}(?:{_COMMON.format(number=number.pattern)})?", re.DOTALL)
    for floats, number in ((True, _NUMBER), (False, _INT))
}


# ASCII characters that are tokens of their own (letters, `_` and digits start names and
# numbers, quotes strings; the pattern reads those).
_PUNCTUATION = frozenset(chr(c) for c in range(128)) - frozenset(
    "_\"'`0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
)

_ASCII_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_NAME_START = frozenset("_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
# Those that cannot begin a space, a comment or a number either (`.5`): read as they are.
_SINGLE = _PUNCTUATION - frozenset(" \t\n\r/.")


class Token(NamedTuple):
    kind: str  # one of the kinds above, or the character itself ("(", "+", ...)
    text: str
    start: int
    end: int


def _is_ident_start(char: str) -> bool:
    return char == "_" or char.isalpha()


def _is_ident_part(char: str) -> bool:
    return char in "_-" or char.isalpha() or char.isdigit()


_new_token = tuple.__new__  # Token(...) without NamedTuple's Python-level __new__


class Scanner:
    def __init__(self, text: str, start: int = 0) -> None:
        self.text = text
        self.pos = start
        self.pushed: Token | None = None
        self.last: Token = Token(EOF, "", start, start)

    def scan(self, floats: bool = True) -> Token:
        if self.pushed is not None:
            token, self.pushed = self.pushed, None
            self.last = token
            return token
        text, start = self.text, self.pos
        char = text[start : start + 1]
        if char == " ":
            start += 1
            char = text[start : start + 1]
        if char in _SINGLE:  # most tokens: read without the pattern
            self.pos = start + 1
            token = self.last = _new_token(Token, (char, char, start, start + 1))
            return token
        if char in _NAME_START:
            end = _ASCII_IDENT.match(text, start).end()  # type: ignore[union-attr]  # it matches `char`
            if end < len(text) and not text[end].isascii():
                while end < len(text) and _is_ident_part(text[end]):  # a name going on in another alphabet
                    end += 1
            self.pos = end
            token = self.last = _new_token(Token, (IDENT, text[start:end], start, end))
            return token
        match = _TOKEN[floats].match(text, self.pos)
        assert match is not None  # the pattern matches "" at least
        kind = match.lastgroup
        if kind is None:
            start = match.end()
            char = text[start : start + 1]
            if char in _PUNCTUATION:  # a character that is its own token
                self.pos = start + 1
                token = _new_token(Token, (char, char, start, start + 1))
            else:
                token = self._other(start)
        else:
            start, end = match.span(kind)
            if kind == IDENT and end < len(text) and not text[end].isascii():
                while end < len(text) and _is_ident_part(text[end]):  # a name going on in another alphabet
                    end += 1
            self.pos = end
            token = _new_token(Token, (kind, text[start:end], start, end))
        self.last = token
        return token

    def unread(self) -> None:
        """gval's Camouflage: the next scan returns the last token again."""
        self.pushed = self.last

    def peek_char(self) -> str:
        """The next character right after the last token (no whitespace skipped)."""
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def next_char(self) -> str:
        char = self.peek_char()
        self.pos += len(char)
        return char

    def _other(self, start: int) -> Token:
        """The token at `start` that the common pattern does not read."""
        text = self.text
        self.pos = start
        if start >= len(text):
            return Token(EOF, "", start, start)
        char = text[start]
        end = start + 1
        if _is_ident_start(char):  # not ASCII
            while end < len(text) and _is_ident_part(text[end]):
                end += 1
            kind = IDENT
        elif char in "\"'`":
            # No closing quote (or a line break before it; a backquote's string may hold them).
            raise ExpressionError(f"string literal not terminated at column {start + 1}")
        else:
            # Digits are ASCII, as Go's isDecimal: `²` or `٣` is a character of its own (an error).
            kind = char
        self.pos = end
        return Token(kind, text[start:end], start, end)


def describe(token: Token) -> str:
    if token.kind == EOF:
        return "the end"
    if token.kind in (IDENT, NUMBER, STRING, CHAR, RAW):
        return repr(token.text)
    return f"'{token.kind}'"


_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}


def unquote(token: Token) -> str:
    """strconv.Unquote for "…" and `…`; gvalstrings' variant for '…' (which allows \\')."""
    body = token.text[1:-1]
    if token.kind == RAW:
        return body.replace("\r", "")
    quote = token.text[0]
    out: list[str] = []
    i = 0
    while i < len(body):
        char = body[i]
        if char == quote:
            raise ExpressionError(f"invalid string literal {token.text} at column {token.start + 1}")
        if char != "\\":
            out.append(char)
            i += 1
            continue
        esc = body[i + 1 : i + 2]
        i += 2
        if esc in _ESCAPES:
            out.append(_ESCAPES[esc])
        elif esc in ("'", '"'):
            if quote == '"' and esc == "'":
                raise ExpressionError(f"invalid escape \\' in {token.text} at column {token.start + 1}")
            out.append(esc)
        elif esc in ("x", "u", "U"):
            size = {"x": 2, "u": 4, "U": 8}[esc]
            digits = body[i : i + size]
            if len(digits) != size or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise ExpressionError(f"invalid escape in {token.text} at column {token.start + 1}")
            code = int(digits, 16)
            if esc != "x" and (code > 0x10FFFF or 0xD800 <= code <= 0xDFFF):
                raise ExpressionError(f"invalid escape in {token.text} at column {token.start + 1}")
            out.append(chr(code))
            i += size
        elif esc and esc in "01234567":
            digits = body[i - 1 : i + 2]
            if len(digits) != 3 or not all(c in "01234567" for c in digits) or int(digits, 8) > 255:
                raise ExpressionError(f"invalid escape in {token.text} at column {token.start + 1}")
            out.append(chr(int(digits, 8)))
            i += 2
        else:
            raise ExpressionError(f"invalid escape \\{esc} in {token.text} at column {token.start + 1}")
    return "".join(out)


def parse_number(token: Token) -> float:
    """strconv.ParseFloat of the token: decimal (underscores between digits) or hex with p."""
    text = token.text
    cleaned = text.replace("_", "")
    try:
        if "_" in text and (re.search(r"(^|[^0-9a-fA-F])_|_($|[^0-9a-fA-F])", text) or "__" in text):
            raise ValueError
        if cleaned[:2].lower() == "0x":
            if "p" not in cleaned.lower():
                raise ValueError
            value = float.fromhex(cleaned)
        elif cleaned[:2].lower() in ("0b", "0o"):
            raise ValueError
        else:
            value = float(cleaned)
    except ValueError:
        raise ExpressionError(f'cannot read the number "{text}" at column {token.start + 1}') from None
    if math.isinf(value):
        raise ExpressionError(f'the number "{text}" at column {token.start + 1} is out of range')
    return value


# ---------------------------------------------------------------------------------------------
# Values and gval's conversions


def to_float(value: Any) -> float | None:
    """gval's convertToFloat: numbers, and strings that parse as one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        return value
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:
            # Only data brings such a number (JSON's 1000…0 with 400 digits); Go could not
            # have read it into a float64 at all.
            digits = str(abs(value))
            raise EvaluationError(
                f"the number {'-' if value < 0 else ''}{digits[:12]}… ({len(digits)} digits) "
                "is too large for a float64"
            ) from None
    if isinstance(value, str):
        try:
            return _go_parse_float(value)
        except ValueError:
            return None
    return None


def _go_parse_float(text: str) -> float:
    if not re.fullmatch(
        r"[+-]?(\d[\d_]*(\.[\d_]*)?|\.\d[\d_]*)([eE][+-]?\d+)?|[+-]?(inf|infinity|nan)", text, re.I
    ):
        raise ValueError(text)
    return float(text.replace("_", ""))


def to_bool(value: Any) -> bool | None:
    """gval's convertToBool: bools, "true"/"TRUE"/"false"/"FALSE", null, and numbers (≠ 0)."""
    if isinstance(value, bool):
        return value
    if value is None or value in ("false", "FALSE"):
        return False
    if value in ("true", "TRUE"):
        return True
    number = to_float(value)
    if number is not None:
        return number != 0.0
    return None


def _int64(value: float) -> int:
    if math.isnan(value) or math.isinf(value):
        return -(2**63)
    number = int(value)
    return (number + 2**63) % 2**64 - 2**63


def _arith(op: str, a: float, b: float) -> Any:
    try:
        match op:
            case "+":
                return a + b
            case "-":
                return a - b
            case "*":
                return a * b
            case "/":
                if b == 0:
                    return (
                        math.nan
                        if a == 0 or math.isnan(a)
                        else math.copysign(math.inf, a) * math.copysign(1, b)
                    )
                return a / b
            case "%":
                return math.fmod(a, b) if b != 0 and not math.isinf(a) else math.nan
            case "**":
                return math.pow(a, b)
            case "^":
                return float(_int64(a) ^ _int64(b))
            case "&":
                return float(_int64(a) & _int64(b))
            case "|":
                return float(_int64(a) | _int64(b))
            case "<<":
                shift = _int64(b) % 2**64
                return float(_int64(float(_int64(a) << shift)) if shift < 64 else 0)
            case ">>":
                shift = _int64(b) % 2**64
                return float(_int64(a) >> min(shift, 63))
            case ">":
                return a > b
            case ">=":
                return a >= b
            case "<":
                return a < b
            case "<=":
                return a <= b
            case "==":
                return a == b
            case "!=":
                return a != b
    except OverflowError:
        return math.inf
    except ValueError:
        return math.nan
    raise AssertionError(op)


NUMBER_OPS = {"+", "-", "*", "/", "%", "**", "^", "&", "|", "<<", ">>", ">", ">=", "<", "<=", "==", "!="}
TEXT_OPS = {"+", "<", "<=", ">", ">="}
BOOL_OPS = {"&&", "||", "==", "!="}
ARBITRARY_OPS = {"==", "!="}
REGEX_OPS = {"=~", "!~"}
PRECEDENCE = {
    "||": 20,
    "&&": 21,
    **{op: 40 for op in ("==", "!=", ">", ">=", "<", "<=", "=~", "!~")},
    **{op: 60 for op in ("^", "&", "|")},
    "<<": 90,
    ">>": 90,
    "+": 120,
    "-": 120,
    "*": 150,
    "/": 150,
    "%": 150,
    "**": 200,
}


def _text(op: str, a: str, b: str) -> Any:
    match op:
        case "+":
            return a + b
        case "<":
            return a < b
        case "<=":
            return a <= b
        case ">":
            return a > b
        case ">=":
            return a >= b
    raise AssertionError(op)


def _boolean(op: str, a: bool, b: bool) -> bool:
    match op:
        case "&&":
            return a and b
        case "||":
            return a or b
        case "==":
            return a == b
        case "!=":
            return a != b
    raise AssertionError(op)


def apply_infix(op: str, a: Any, b: Any, budget: Budget | None = None) -> Any:
    """gval's operator dispatch: exact float64s, exact bools, exact strings, then the same
    with conversion (numeric strings are numbers, "true" is true), then the catch-all."""
    if op in NUMBER_OPS and isinstance(a, float) and isinstance(b, float):
        return _arith(op, a, b)
    if op in BOOL_OPS and isinstance(a, bool) and isinstance(b, bool):
        return _boolean(op, a, b)
    if op in TEXT_OPS and isinstance(a, str) and isinstance(b, str):
        if op == "+" and budget is not None:
            budget.produce(len(a) + len(b))
        return _text(op, a, b)
    if op in NUMBER_OPS:
        x, y = to_float(a), to_float(b)
        if x is not None and y is not None:
            return _arith(op, x, y)
    if op in BOOL_OPS:
        p, q = to_bool(a), to_bool(b)
        if p is not None and q is not None:
            return _boolean(op, p, q)
    if op in TEXT_OPS and op not in ARBITRARY_OPS and a is not None and b is not None:
        x, y = sprint(a, budget), sprint(b, budget)
        if op == "+" and budget is not None:
            budget.produce(len(x) + len(y))
        return _text(op, x, y)
    if op in ARBITRARY_OPS:
        equal = deep_equal(a, b, budget)
        return equal if op == "==" else not equal
    raise EvaluationError(f"invalid operation ({type_name(a)}) {op} ({type_name(b)})")


def shown(value: Any, budget: Budget | None) -> str:
    """A value in an error message: its text, cut short."""
    text = sprint(value, budget)
    return text if len(text) <= 200 else text[:200] + "…"


def _regex_match(pattern: str, text: str) -> bool:
    import re2  # RE2, as Go's regexp: linear time on untrusted patterns

    try:
        return re2.search(pattern, text) is not None
    except re2.error as exc:
        raise EvaluationError(f"error parsing regexp: {exc}") from None


# ---------------------------------------------------------------------------------------------
# The syntax tree


@dataclass
class Options:
    """What a language instance knows: its functions (none in path() and !Data queries, as
    in relay-core).

    An expression walks values with DEFAULT_EVALUATOR alone: what it reaches (a parameter, an
    output, event data, a settled spec) is data, and a string there is text, never a template
    (evaluated again, `${secrets.x}` in a webhook's body would read a secret)."""

    functions: dict[str, "Descriptor"] = field(default_factory=dict)


class Node:
    is_const = False

    def eval(self, ctx: Context, parameter: Any) -> Any:
        raise NotImplementedError

    def children(self) -> Iterator["Node"]:
        return iter(())


@dataclass
class Const(Node):
    value: Any
    is_const = True

    def eval(self, ctx: Context, parameter: Any) -> Any:
        return self.value


@dataclass
class Var(Node):
    """A path from the root of the data: `$`, `a.b[c]`. Keys evaluate against the root."""

    keys: list[Node]
    options: Options

    def children(self) -> Iterator[Node]:
        return iter(self.keys)

    def eval(self, ctx: Context, parameter: Any) -> Any:
        evaluator = DEFAULT_EVALUATOR
        value = parameter
        parents: list[Any] = []
        try:
            for key_node in self.keys:
                ctx.budget.spend()
                key = key_node.eval(ctx, parameter)
                parents.append(key)
                if isinstance(value, Indexable):
                    value = value.lookup(ctx, key)
                    continue
                result = evaluator.evaluate(ctx, value, 1)
                if not result.complete:
                    ctx.unresolvable.extend(result.unresolvable)
                    return None
                value = select(ctx, result.value, key)
            result = evaluator.evaluate(ctx, value, 1)
            if not result.complete:
                ctx.unresolvable.extend(result.unresolvable)
            return result.value
        except EvaluationError as exc:
            error: EvaluationError = exc
            for parent in reversed(parents):
                error = PathError(shown(parent, ctx.budget), error)
            raise error from None


@dataclass
class Call(Node):
    name: str
    args: list[Node] | dict[str, Node]
    options: Options

    def children(self) -> Iterator[Node]:
        return iter(self.args.values() if isinstance(self.args, dict) else self.args)

    def eval(self, ctx: Context, parameter: Any) -> Any:
        ctx.budget.spend()
        descriptor = self.options.functions.get(self.name)
        if descriptor is None:
            return unresolved(invocations={(self.name, "function not found")})
        try:
            if isinstance(self.args, dict):
                keyword = {k: EvalExpandable(v, parameter) for k, v in self.args.items()}
                invoker = descriptor.keyword(DEFAULT_EVALUATOR, keyword)
            else:
                positional = [EvalExpandable(v, parameter) for v in self.args]
                invoker = descriptor.positional(DEFAULT_EVALUATOR, positional)
        except ArgumentError as exc:
            return unresolved(invocations={(self.name, str(exc))})
        try:
            result = invoker(ctx)
        except InvocationError:
            raise
        except EvaluationError as exc:
            raise InvocationError(self.name, exc) from None
        if not result.complete:
            return StaticExpandable(None, result.unresolvable)
        return result.value


@dataclass
class Unary(Node):
    op: str
    operand: Node

    def children(self) -> Iterator[Node]:
        yield self.operand

    def eval(self, ctx: Context, parameter: Any) -> Any:
        return apply_prefix(self.op, self.operand.eval(ctx, parameter), ctx.budget)


def apply_prefix(op: str, value: Any, budget: Budget | None = None) -> Any:
    if op == "!":
        truth = to_bool(value)
        if truth is None:
            raise EvaluationError(f"unexpected {type_name(value)} expected bool")
        return not truth
    number = to_float(value)
    if number is None:
        raise EvaluationError(f"unexpected {shown(value, budget)}({type_name(value)}) expected number")
    return -number if op == "-" else float(~_int64(number))


@dataclass
class Binary(Node):
    op: str
    left: Node
    right: Node

    def children(self) -> Iterator[Node]:
        yield self.left
        yield self.right

    def eval(self, ctx: Context, parameter: Any) -> Any:
        a = self.left.eval(ctx, parameter)
        if self.op == "&&" and a is False:
            return False
        if self.op == "||" and a is True:
            return True
        b = self.right.eval(ctx, parameter)
        if self.op in REGEX_OPS:
            matched = _regex_match(sprint(b, ctx.budget), sprint(a, ctx.budget))
            return matched if self.op == "=~" else not matched
        return apply_infix(self.op, a, b, ctx.budget)


@dataclass
class Pipe(Node):
    left: Node
    right: Node

    def children(self) -> Iterator[Node]:
        yield self.left
        yield self.right

    def eval(self, ctx: Context, parameter: Any) -> Any:
        ctx.budget.spend()
        return self.right.eval(ctx, self.left.eval(ctx, parameter))


@dataclass
class Array(Node):
    items: list[Node]

    def children(self) -> Iterator[Node]:
        return iter(self.items)

    def eval(self, ctx: Context, parameter: Any) -> Any:
        ctx.budget.spend(len(self.items) + 1)
        return [item.eval(ctx, parameter) for item in self.items]


@dataclass
class Object(Node):
    pairs: list[tuple[Node, Node]]

    def children(self) -> Iterator[Node]:
        for key, value in self.pairs:
            yield key
            yield value

    def eval(self, ctx: Context, parameter: Any) -> Any:
        ctx.budget.spend(len(self.pairs) + 1)
        out: dict[str, Any] = {}
        for key, value in self.pairs:
            evaluated = value.eval(ctx, parameter)
            out[sprint(key.eval(ctx, parameter), ctx.budget)] = evaluated
        return out


class EvalExpandable(Expandable):
    """A function argument, evaluated when (and if) the function asks for it."""

    def __init__(self, node: Node, parameter: Any) -> None:
        self.node = node
        self.parameter = parameter

    def expand(self, ctx: Context, depth: int) -> Result:
        inner = ctx.fresh()
        value = self.node.eval(inner, self.parameter)
        return Result(value, inner.unresolvable)


# ---------------------------------------------------------------------------------------------
# Selecting into values (leg's gvalutil eval.Select)


def string_key(key: Any) -> str:
    match key:
        case str():
            return key
        case bool():
            pass
        case int():
            return str(key)
        case float():
            return format_float(key, "f")
        case _ if hasattr(key, "isoformat"):
            return format_time(key)
    raise EvaluationError(f"unexpected key type {type_name(key)} for map")


def int_index(key: Any) -> int:
    if isinstance(key, str):
        try:
            value = int(key, 10)
        except ValueError:
            raise EvaluationError(
                f'unexpected string index "{key}" for slice, must be convertible to int: '
                f'strconv.ParseInt: parsing "{key}": invalid syntax'
            ) from None
        return value
    if isinstance(key, bool) or not is_number(key) or (isinstance(key, float) and not math.isfinite(key)):
        raise EvaluationError(f"unexpected index type {type_name(key)} for slice")
    return int(key)


def select(ctx: Context, value: Any, key: Any) -> Any:
    if isinstance(value, Indexable):
        return value.lookup(ctx, key)
    if isinstance(value, list):
        index = int_index(key)
        if index < 0 and len(value) + index >= 0:
            index += len(value)
        elif index < 0 or index >= len(value):
            raise IndexOutOfBounds(index)
        return value[index]
    if isinstance(value, dict):
        name = string_key(key)
        if name not in value:
            raise UnknownKey(name)
        return value[name]
    field_name = string_key(key)
    raise EvaluationError(f"unsupported value type {type_name(value)} for select of field {field_name}")


# ---------------------------------------------------------------------------------------------
# The parser (gval's ParseExpression with relay's pathlang extensions)


@dataclass
class _Stage:
    node: Node
    op: str | None = None
    precedence: int = 0


class Parser:
    def __init__(self, text: str, options: Options, start: int = 0) -> None:
        if len(text) > MAX_EXPRESSION_CHARS:
            raise ExpressionError(f"The expression is over {MAX_EXPRESSION_CHARS} characters.")
        self.scanner = Scanner(text, start)
        self.options = options
        self.depth = 0

    def error(self, unit: str, expected: str = "") -> ExpressionError:
        token = self.scanner.last
        message = f"unexpected {describe(token)} while scanning {unit}"
        if expected:
            message += f", expected {expected}"
        return ExpressionError(f"{message} (column {token.start + 1})")

    def parse_expression(self) -> Node:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise ExpressionError(f"The expression nests deeper than {MAX_NESTING} levels.")
        stack: list[_Stage] = []
        while True:
            node = self.parse_next()
            if not stack:
                # One operand and no operator after it (most expressions): what
                # parse_operator, _push and the pop below would give.
                scanner = self.scanner
                following = scanner.scan()
                scanner.unread()
                if following.kind not in OPERATOR_CHARS:
                    self.depth -= 1
                    return node
            stage = self.parse_operator(stack, node)
            self._push(stack, stage)
            if stack[-1].op is None:
                self.depth -= 1
                return stack.pop().node

    def _push(self, stack: list[_Stage], stage: _Stage) -> None:
        while stack and stack[-1].precedence >= stage.precedence:
            left = stack.pop()
            assert left.op is not None
            stage.node = self._build(left.op, left.node, stage.node)
        stack.append(stage)

    def _build(self, op: str, left: Node, right: Node) -> Node:
        node = Binary(op, left, right)
        if left.is_const and right.is_const:
            # gval folds constants while parsing, so `1 - 'a'` is a parse error.
            try:
                return Const(node.eval(Context(), None))
            except EvaluationError as exc:
                raise ExpressionError(str(exc)) from None
        return node

    def parse_next(self) -> Node:
        token = self.scanner.scan()
        kind = token.kind
        if kind == NUMBER:
            return Const(parse_number(token))
        if kind in (STRING, RAW, CHAR):
            return Const(unquote(token))
        if kind in ("-", "!", "~"):
            operand = self.parse_next()
            if operand.is_const:
                try:
                    return Const(apply_prefix(kind, operand.eval(Context(), None)))
                except EvaluationError as exc:
                    raise ExpressionError(str(exc)) from None
            return Unary(kind, operand)
        if kind == "(":
            node = self.parse_expression()
            if self.scanner.scan().kind != ")":
                raise self.error("parentheses", "')'")
            return node
        if kind == "[":
            return self.parse_array()
        if kind == "{":
            return self.parse_object()
        if kind == "$":
            return self.ident_var([])
        if kind == IDENT:
            if token.text in ("true", "false", "null"):
                return Const({"true": True, "false": False, "null": None}[token.text])
            if self.scanner.scan(floats=False).kind == "(":
                return self.ident_func(token.text)
            self.scanner.unread()
            return self.ident_var([Const(token.text)])
        raise self.error("an expression")

    def parse_array(self) -> Node:
        items: list[Node] = []
        while True:
            kind = self.scanner.scan().kind
            if kind == ",":
                continue
            if kind == "]":
                return Array(items)
            self.scanner.unread()
            items.append(self.parse_expression())

    def parse_object(self) -> Node:
        pairs: list[tuple[Node, Node]] = []
        while True:
            kind = self.scanner.scan().kind
            if kind == ",":
                continue
            if kind == "}":
                return Object(pairs)
            self.scanner.unread()
            key = self.parse_expression()
            self.scanner.scan()  # the ':' (gval takes whatever token stands there)
            pairs.append((key, self.parse_expression()))

    def ident_var(self, keys: list[Node]) -> Node:
        while True:
            kind = self.scanner.scan(floats=False).kind
            if kind == ".":
                token = self.scanner.scan(floats=False)
                if token.kind == IDENT:
                    keys.append(Const(token.text))
                else:
                    self.scanner.unread()
                    keys.append(self.parse_next())
            elif kind == "[":
                keys.append(self.parse_expression())
                if self.scanner.scan().kind != "]":
                    raise self.error("a key", "']'")
            else:
                self.scanner.unread()
                return Var(keys, self.options)

    def ident_func(self, name: str) -> Node:
        token = self.scanner.scan()
        if token.kind == ")":
            return Call(name, [], self.options)
        if token.kind == IDENT and self.scanner.peek_char() == ":":
            self.scanner.next_char()
            keyword: dict[str, Node] = {token.text: self.parse_expression()}
            while True:
                kind = self.scanner.scan().kind
                if kind == ")":
                    return Call(name, keyword, self.options)
                if kind != ",":
                    raise self.error("function arguments", "',' or ')'")
                key = self.scanner.scan()
                if key.kind != IDENT:
                    raise self.error("a function argument name")
                if self.scanner.scan().kind != ":":
                    raise self.error("a function argument name", "':'")
                keyword[key.text] = self.parse_expression()
        self.scanner.unread()
        positional: list[Node] = []
        while True:
            positional.append(self.parse_expression())
            kind = self.scanner.scan().kind
            if kind == ")":
                return Call(name, positional, self.options)
            if kind != ",":
                raise self.error("function arguments", "',' or ')'")

    def parse_operator(self, stack: list[_Stage], node: Node) -> _Stage:
        while True:
            token = self.scanner.scan()
            if token.kind not in OPERATOR_CHARS:
                self.scanner.unread()
                return _Stage(node)
            op = token.kind
            scanner = self.scanner
            more = _OPERATOR_RUN.match(scanner.text, scanner.pos).end() - scanner.pos  # type: ignore[union-attr]
            if more:  # the operator characters right after it (no space between)
                op += scanner.text[scanner.pos : scanner.pos + more]
                scanner.pos += more
            if op in PRECEDENCE:
                return _Stage(node, op, PRECEDENCE[op])
            if op == "|>":
                # A postfix operator: everything to its left is its input, everything to its
                # right (up to the end of the expression) runs against that input.
                self._push(stack, _Stage(node))
                left = stack.pop().node
                node = Pipe(left, self.parse_expression())
                continue
            if len(op) == 1:
                self.scanner.unread()
                return _Stage(node)
            raise ExpressionError(f"unknown operator {op} (column {token.start + 1})")


def parse_expression(text: str, options: Options) -> Node:
    """A whole string as one expression (path() queries, !Data queries)."""
    parser = Parser(text, options)
    node = parser.parse_expression()
    if parser.scanner.scan().kind != EOF:
        raise parser.error("an operator")
    return node


# ---------------------------------------------------------------------------------------------
# Templates


@dataclass
class Expression:
    """One `${…}` part of a template."""

    node: Node
    source: str


@dataclass
class Template:
    source: str
    parts: list[str | Expression]

    @property
    def expressions(self) -> list[Expression]:
        return [p for p in self.parts if isinstance(p, Expression)]

    def evaluate(self, ctx: Context, parameter: Any, unresolvable: Unresolvable) -> Any:
        """The template's value; unresolved references are added to `unresolvable`."""
        values: list[Any] = []
        for part in self.parts:
            if isinstance(part, str):
                value: Any = part
            else:
                value = run_expression(
                    ctx, part.node, parameter, unresolvable, DEFAULT_EVALUATOR, template=True
                )
            # leg's StringJoiner with empty strings eliminated: "${x}" alone keeps x's type.
            if not (isinstance(value, str) and value == ""):
                values.append(value)
        if not values:
            return ""
        if len(values) == 1:
            return values[0]
        texts = [_format(value, ctx) for value in values]
        ctx.budget.produce(sum(len(text) for text in texts))
        return "".join(texts)


def _format(value: Any, ctx: Context) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        ctx.budget.check_value(len(value))
        return value.decode("utf-8", "surrogateescape")
    if hasattr(value, "isoformat"):
        return format_time(value)
    return to_json(value, indent="\t", budget=ctx.budget)


def run_expression(
    ctx: Context,
    node: Node,
    parameter: Any,
    unresolvable: Unresolvable,
    evaluator: Evaluator,
    *,
    template: bool = False,
) -> Any:
    """pathlang's Expression: evaluate, then expand the value fully with the language's evaluator."""
    inner = Context(unresolvable=unresolvable, clock=ctx.clock, budget=ctx.budget)
    try:
        value = node.eval(inner, parameter)
        result = evaluate_all(ctx, evaluator, value)
    except EvaluationError as exc:
        if template:
            raise EvaluationError(f'evaluating template "${{": {exc}') from exc
        raise
    except RecursionError:
        raise EvaluationError("the expression nests too deeply") from None
    except DATA_ERRORS as exc:
        raise data_error(exc) from exc
    unresolvable.extend(result.unresolvable)
    return result.value


def parse_template(text: str, options: Options) -> Template:
    """The parts of a string: text and `${…}` expressions. Raises ExpressionError."""
    parts: list[str | Expression] = []
    position = 0
    while position < len(text):
        dollar = text.find("$", position)
        if dollar < 0:
            parts.append(text[position:])
            break
        if dollar > position:
            parts.append(text[position:dollar])
        following = text[dollar + 1 : dollar + 2]
        if following != "{":
            # "$x" is text; "$" at the end too. There is no escape for "${".
            parts.append("$" + following)
            position = dollar + 2
            continue
        parser = Parser(text, options, start=dollar + 2)
        try:
            node = parser.parse_expression()
        except RecursionError:
            raise ExpressionError("The expression nests too deeply.") from None
        end = parser.scanner.scan()
        if end.kind != "}":
            raise ExpressionError(
                f'unexpected {describe(end)} while scanning template "${{" end, '
                f"expected '}}' (column {end.start + 1})"
            )
        parts.append(Expression(node, text[dollar : end.end]))
        position = end.end
    return Template(text, parts)


@lru_cache(maxsize=256)
def _query_node(query: str) -> Node:
    """A query parsed once per process: a step asks the same few (relay_sdk's `get(D.x)`, a
    trigger's `!Data host`) again and again, and parsing was most of a query's time."""
    return parse_expression(query, Options())


def evaluate_query(ctx: Context, tree: Any, query: str) -> Result:
    """relay-core's query.EvaluateQuery with the path language: `query` against `tree`, a
    value (event data, or a tree an evaluator settled: Evaluator.settle), read as data."""
    evaluator = DEFAULT_EVALUATOR
    try:
        node = _query_node(query) if len(query) <= 1024 else parse_expression(query, Options())
    except ExpressionError as exc:
        raise EvaluationError(f"parsing error: {query}: {exc}") from None
    unresolvable = Unresolvable()
    try:
        value = run_expression(ctx, node, tree, unresolvable, evaluator)
    except EvaluationError:
        if unresolvable:
            # An error while traversing data that is not all there yet is most likely caused
            # by the missing data; the query cannot be evaluated until it is there.
            return Result(None, unresolvable)
        raise
    result = evaluate_all(ctx, evaluator, value)
    result.unresolvable.extend(unresolvable)
    return result


def walk(node: Node) -> Iterator[Node]:
    """`node` and every node under it, in order. A loop, not nested generators: those pass
    each node up through every level, which is quadratic in a long `|>` chain."""
    pending = [node]
    while pending:
        current = pending.pop()
        yield current
        pending.extend(reversed(list(current.children())))
