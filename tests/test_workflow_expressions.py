"""The expression language, the function library, the YAML tags and the evaluator, held to
relay-core's own table tests (pkg/expr at cdb56ed33218: parse/yaml_test.go,
pathlang/lang_test.go, evaluate/evaluate_test.go, fnlib/*_test.go, and fnlib/exists_test.go
from the commit that added exists()). The cases are ported as data; Go's float64 numbers
are Python floats, its int is int."""

import textwrap
from datetime import UTC, datetime
from typing import Any

import pytest

from workflows.dialect import expr
from workflows.dialect.errors import ArgumentError, EvaluationError, ExpressionError
from workflows.dialect.evaluate import Data, WorkflowEvaluator, evaluate
from workflows.dialect.fn import Descriptor
from workflows.dialect.fnlib import LIBRARY, convert_markdown
from workflows.dialect.model import DEFAULT_EVALUATOR, Context, Result, Unresolvable, evaluate_all, unresolved
from workflows.dialect.problems import DocumentError
from workflows.dialect.values import from_json
from workflows.dialect.yamlload import load


def secret(name: str) -> dict:
    return {"$type": "Secret", "name": name}


def parameter(name: Any) -> dict:
    return {"$type": "Parameter", "name": name}


def output(source: str, name: str) -> dict:
    return {"$type": "Output", "from": source, "name": name}


def connection(kind: str, name: str) -> dict:
    return {"$type": "Connection", "type": kind, "name": name}


def answer(ask: str, name: str) -> dict:
    return {"$type": "Answer", "askRef": ask, "name": name}


def invocation(name: str, args: Any) -> dict:
    return {f"$fn.{name}": args}


def missing(**kinds: list[tuple]) -> dict:
    """The `unresolvable` of a result, as Unresolvable.as_dict() writes it."""
    names = {
        "parameters": ("name",),
        "secrets": ("name",),
        "data": ("name",),
        "outputs": ("from", "name"),
        "connections": ("type", "name"),
        "answers": ("askRef", "name"),
    }
    return {
        kind: [dict(zip(names[kind], entry, strict=True)) for entry in sorted(entries)]
        for kind, entries in kinds.items()
    }


# parse/yaml_test.go -----------------------------------------------------------------------------

YAML_CASES = [
    (
        "basic",
        "aws:\n  accessKeyID: foo\n  region: us-west-2\nop: something",
        {"aws": {"accessKeyID": "foo", "region": "us-west-2"}, "op": "something"},
    ),
    (
        "secret scalar",
        "aws:\n  secretAccessKey: !Secret secretAccessKey",
        {"aws": {"secretAccessKey": secret("secretAccessKey")}},
    ),
    (
        "secret sequence",
        "aws:\n  secretAccessKey: !Secret [secretAccessKey]",
        {"aws": {"secretAccessKey": secret("secretAccessKey")}},
    ),
    (
        "secret mapping",
        "aws:\n  secretAccessKey: !Secret {name: secretAccessKey}",
        {"aws": {"secretAccessKey": secret("secretAccessKey")}},
    ),
    ("connection sequence", "op: !Connection [aws, test-creds]", {"op": connection("aws", "test-creds")}),
    (
        "connection mapping",
        "op: !Connection {type: aws, name: test-creds}",
        {"op": connection("aws", "test-creds")},
    ),
    ("output sequence", "op: !Output [prev, operation]", {"op": output("prev", "operation")}),
    ("output mapping", "op: !Output {from: prev, name: operation}", {"op": output("prev", "operation")}),
    (
        "parameter scalar",
        "aws:\n  accessKeyID: !Parameter accessKeyID",
        {"aws": {"accessKeyID": parameter("accessKeyID")}},
    ),
    (
        "parameter sequence",
        "aws:\n  accessKeyID: !Parameter [accessKeyID]",
        {"aws": {"accessKeyID": parameter("accessKeyID")}},
    ),
    (
        "parameter mapping",
        "aws:\n  accessKeyID: !Parameter {name: accessKeyID}",
        {"aws": {"accessKeyID": parameter("accessKeyID")}},
    ),
    (
        "conditional invocation",
        '- !Fn.equals [!Parameter param1, "foobar"]\n- !Fn.notEquals [!Parameter param2, "barfoo"]',
        [
            invocation("equals", [parameter("param1"), "foobar"]),
            invocation("notEquals", [parameter("param2"), "barfoo"]),
        ],
    ),
    (
        "invocation scalar",
        'message: !Fn.jsonUnmarshal \'{"foo": "bar"}\'',
        {"message": invocation("jsonUnmarshal", ['{"foo": "bar"}'])},
    ),
    (
        "invocation sequence",
        'message: !Fn.concat ["Hello, ", !Parameter name]',
        {"message": invocation("concat", ["Hello, ", parameter("name")])},
    ),
    (
        "invocation mapping",
        "message: !Fn.getMessage {host: api.example.com}",
        {"message": invocation("getMessage", {"host": "api.example.com"})},
    ),
    (
        "binary encoding",
        "message: !!binary SGVsbG8sIJCiikU=",
        {"message": {"$encoding": "base64", "data": "SGVsbG8sIJCiikU="}},
    ),
    ("answer mapping", "ok: !Answer {askRef: gate, name: approval}", {"ok": answer("gate", "approval")}),
    ("data scalar", "host: !Data report.host", {"host": {"$type": "Data", "query": "report.host"}}),
]


@pytest.mark.parametrize(("source", "expected"), [c[1:] for c in YAML_CASES], ids=[c[0] for c in YAML_CASES])
def test_yaml_tags_become_relay_core_parse_trees(source: str, expected: Any) -> None:
    assert load(source).tree == expected


def test_an_unknown_tag_is_an_error_that_says_where() -> None:
    with pytest.raises(DocumentError) as raised:
        load("steps:\n- spec:\n    message: !Fetch ball\n")
    (problem,) = raised.value.problems
    assert problem.pointer == "#/steps/0/spec/message"
    assert (problem.line, problem.column) == (3, 14)
    assert "Unknown tag !Fetch" in problem.detail


# pathlang/lang_test.go ---------------------------------------------------------------------------

NOW = datetime(2021, 5, 31, tzinfo=UTC)
INPUT = {
    "a": [1, 2, [3, 4]],
    "b": 10,
    "c": {"x": 1, "y": 2, "x y": {"z": 3}, "false": 4},
}
C_EXPANDED = {"x": 1, "y": 2, "x y": {"z": 3}, "false": 4}
NO = None
U_FOO = missing(parameters=[("foo",)])

# name, expression, expected value, expected unresolvable, expected error (a substring)
EXPRESSION_CASES: list[tuple[str, str, Any, dict, str]] = [
    ("map path with bracket syntax", "c['x y']['z']", 3, {}, ""),
    ("map path with dot syntax", "c.x", 1, {}, ""),
    ("map path with dot syntax and constant string", "c.'x y'", {"z": 3}, {}, ""),
    ("map path with dot syntax and constant string traversal", "c.'x y'.z", 3, {}, ""),
    ("map path with reserved identifier", "c.false", 4, {}, ""),
    ("map path with operators", "c.('x ' + 'y').z", 3, {}, ""),
    ("array path with bracket syntax", "a[0]", 1, {}, ""),
    ("array path with dot syntax", "a.0", 1, {}, ""),
    ("array path with dot syntax traversal with dot syntax", "a.2.1", 4, {}, ""),
    ("array path with dot syntax traversal with bracket syntax", "a.2[1]", 4, {}, ""),
    (
        "invalid map path",
        "a.x",
        NO,
        {},
        'path "a.x": unexpected string index "x" for slice, must be convertible to int: '
        'strconv.ParseInt: parsing "x": invalid syntax',
    ),
    ("root", "$", {**INPUT, "c": C_EXPANDED, "d": None}, U_FOO, ""),
    ("map path from root", "$.c.x", 1, {}, ""),
    ("invalid character after root", "$$", NO, {}, "unexpected '$'"),
    ("map path from root with dot syntax and constant string", "$.c.'x y'.z", 3, {}, ""),
    ("map path from root with bracket syntax", "$['c'].x", 1, {}, ""),
    ("invalid path", "$.", NO, {}, "unexpected"),
    ("simple arithmetic", "c.x + c.y", 3.0, {}, ""),
    ("parentheses", "(c.x + c.y) * a[1]", 6.0, {}, ""),
    ("map creation", "{'foo': a[0] + a[1], 'bar': a[1] + a[2][0]}", {"foo": 3.0, "bar": 5.0}, {}, ""),
    ("array creation", '["foo", a[0], c.y]', ["foo", 1, 2], {}, ""),
    ("function call with no arguments", "now()", NOW, {}, ""),
    (
        "function call with one positional argument",
        'jsonUnmarshal(\'{"foo": "bar"}\')',
        {"foo": "bar"},
        {},
        "",
    ),
    ("function call with more than one positional argument", "concat('a', b, 'c')", "a10c", {}, ""),
    (
        "function call with one keyword argument",
        "merge(objects: [{'a': 5}, {'b': b}])",
        {"a": 5.0, "b": 10},
        {},
        "",
    ),
    ("function call with multiple keyword arguments", "path(object: $, query: 'c.y')", 2, {}, ""),
    ("call stack", "path(merge({'a': 5}, {'b': b}), 'b')", 10, {}, ""),
    ("pipe", 'jsonUnmarshal(\'{"x": {"y": "z"}}\') |> x.y', "z", {}, ""),
    ("pipe scope", "b * (jsonUnmarshal('{\"x\": 20}') |> x) + b", 210.0, {}, ""),
    ("pipe dot equivalence", 'jsonUnmarshal(\'{"x": {"y": "z"}}\') |> x |> y', "z", {}, ""),
    ("resolvable coalesce evaluation", "coalesce(c.x, d)", 1, {}, ""),
    ("unresolvable coalesce evaluation", "coalesce(null, d)", None, {}, ""),
    ("resolvable path query", "path($, 'c.x')", 1, {}, ""),
    ("unresolvable path query", "path($, 'd.g')", None, U_FOO, ""),
    ("unresolvable exists evaluation", "exists(d.g)", None, U_FOO, ""),
    ("resolvable exists evaluation for nonexistent key", "exists(c.nope)", False, {}, ""),
    ("resolvable exists evaluation for existent key", "exists(c.x)", True, {}, ""),
]


def _input() -> dict:
    return {**INPUT, "d": unresolved(parameters={("foo",)})}


def _run_expression(text: str, parameter: Any, *, template: bool) -> tuple[Any, Unresolvable]:
    options = expr.Options(functions=LIBRARY)
    unresolvable = Unresolvable()
    ctx = Context(clock=lambda: NOW)
    if template:
        value = expr.parse_template("${" + text + "}", options).evaluate(ctx, parameter, unresolvable)
    else:
        node = expr.parse_expression(text, options)
        value = expr.run_expression(ctx, node, parameter, unresolvable, DEFAULT_EVALUATOR)
    return value, unresolvable


@pytest.mark.parametrize("template", [False, True], ids=["expression", "template"])
@pytest.mark.parametrize(
    ("text", "value", "unresolvable", "error"),
    [c[1:] for c in EXPRESSION_CASES],
    ids=[c[0] for c in EXPRESSION_CASES],
)
def test_expressions(text: str, value: Any, unresolvable: dict, error: str, template: bool) -> None:
    if error:
        with pytest.raises((ExpressionError, EvaluationError)) as raised:
            _run_expression(text, _input(), template=template)
        assert error in str(raised.value)
        return
    got, got_unresolvable = _run_expression(text, _input(), template=template)
    assert got_unresolvable.as_dict() == unresolvable
    assert got == value and type(got) is type(value)


IDENT_INPUT = {"a-b": 42, "x": {"y-z": "foo"}}
IDENT_CASES = [
    ("dash at beginning", "-a-b", -42.0, ""),
    ("dash in middle", "a-b", 42, ""),
    ("dash in middle with subtraction", "a-b - a-b", 0.0, ""),
    ("dash in traversal", "x.y-z", "foo", ""),
    ("nonexistent", "x-y-z", None, 'path "x-y-z": unknown key x-y-z'),
]


@pytest.mark.parametrize("template", [False, True], ids=["expression", "template"])
@pytest.mark.parametrize(
    ("text", "value", "error"), [c[1:] for c in IDENT_CASES], ids=[c[0] for c in IDENT_CASES]
)
def test_identifiers_may_contain_dashes(text: str, value: Any, error: str, template: bool) -> None:
    if error:
        with pytest.raises(EvaluationError, match=error):
            _run_expression(text, IDENT_INPUT, template=template)
        return
    got, unresolvable = _run_expression(text, IDENT_INPUT, template=template)
    assert not unresolvable
    assert got == value and type(got) is type(value)


# gval's operators, as relay-core's language inherits them (not in relay-core's tables) --------

OPERATOR_CASES = [
    ("1 + '2'", 3.0),  # numeric strings are numbers
    ("'a' + 1", "a1"),  # otherwise + joins text (Go's %v)
    ("'a' + 1000000", "a1e+06"),
    ("'1' == 1", True),
    ("1 == true", True),
    ("null == false", True),
    ("'foo' == 'foo'", True),
    ("'foo' != 'bar'", True),
    ("'10' < '9'", True),  # two strings compare as text
    ("10 < '9'", False),
    ("2 ** 3 ** 2", 64.0),  # left-associative, as gval
    ("7 % 3", 1.0),
    ("-7 % 3", -1.0),
    ("1 / 0", float("inf")),
    ("!'false'", True),
    ("false && x.y", False),  # short-circuit: x is never looked at
    ("true || x.y", True),
    ("6 & 3 | 8", 10.0),
    ("1 << 4 >> 2", 4.0),
    ("'abc' =~ 'b'", True),
    ("'abc' !~ '^b'", True),
    ("[1, 2,, 3]", [1.0, 2.0, 3.0]),
]


@pytest.mark.parametrize(("text", "value"), OPERATOR_CASES)
def test_operators_follow_gval(text: str, value: Any) -> None:
    got, _ = _run_expression(text, {}, template=True)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("x==-1", "unknown operator ==-"),
        ("1 - 'a'", "invalid operation (float64) - (string)"),
        ("true && 'x'", "invalid operation (bool) && (string)"),
        ("0x1F", "cannot read the number"),
        ("'unterminated", "not terminated"),
        ("f(a : 1)", "expected ',' or ')'"),
        # Digits are ASCII (Go's isDecimal): other digits are characters of their own, an error.
        ("\u00b2", "unexpected '\u00b2' while scanning an expression"),
        ("1 + .\u0663", "unexpected '.' while scanning an expression"),
        ("a.\u0663", "unexpected '\u0663' while scanning an expression"),
    ],
)
def test_expressions_that_cannot_be_parsed(text: str, error: str) -> None:
    with pytest.raises(ExpressionError, match=error.replace("(", r"\(").replace(")", r"\)")):
        expr.parse_template("${" + text + "}", expr.Options(functions=LIBRARY))


def test_templates_join_text_and_keep_a_whole_expressions_type() -> None:
    data = Data(parameters={"n": 3, "m": {"a": [1]}, "e": ""})
    tree = {
        "typed": "${parameters.n}",
        "text": "n is ${parameters.n}!",
        "json": "m: ${parameters.m}",
        "empty-part": "${parameters.e}${parameters.n}",
        "dollar": "costs $5, ${'$'}{not an expression}",
    }
    assert evaluate(tree, data).value == {
        "typed": 3,
        "text": "n is 3!",
        "json": 'm: {\n\t"a": [\n\t\t1\n\t]\n}',
        "empty-part": 3,
        "dollar": "costs $5, ${not an expression}",
    }


# evaluate/evaluate_test.go: TestEvaluate ----------------------------------------------------------


def _foo_functions() -> dict[str, Descriptor]:
    """The test's own `foo` function: "~~[args]~~" positionally, "~~whiz~~" by keyword."""

    def positional(ev: Any, args: list[Any]) -> Any:
        def invoke(ctx: Context) -> Result:
            values = [evaluate_all(ctx, ev, a) for a in args]
            return Result("~~[" + " ".join(str(v.value) for v in values) + "]~~")

        return invoke

    def keyword(ev: Any, args: dict[str, Any]) -> Any:
        def invoke(ctx: Context) -> Result:
            return Result(f"~~{evaluate_all(ctx, ev, args['whiz']).value}~~")

        return invoke

    return {**LIBRARY, "foo": Descriptor("test", positional, keyword)}


FULL_DATA = Data(
    secrets={"foo": "v3ry s3kr3t!"},
    outputs={("baz", "bar"): "127.0.0.1"},
    parameters={"quux": [1, 2, 3]},
    answers={("baz", "bar"): "approved"},
    connections={("blort", "bar"): {"bar": "blort"}},
    event={"foo": {"bar": "baz"}},
    event_available=True,
)

EVALUATE_CASES: list[tuple[str, str, Data, Any, dict]] = [
    ("literal", '{"foo": "bar"}', Data(), {"foo": "bar"}, {}),
    (
        "unresolvable secret",
        '{"foo": {"$type": "Secret", "name": "bar"}}',
        Data(),
        {"foo": secret("bar")},
        missing(secrets=[("bar",)]),
    ),
    (
        "unresolvable secret in template",
        '{"foo": "${secrets.bar}"}',
        Data(),
        {"foo": "${secrets.bar}"},
        missing(secrets=[("bar",)]),
    ),
    (
        "unresolvable connection",
        '{"foo": {"$type": "Connection", "type": "blort", "name": "bar"}}',
        Data(),
        {"foo": connection("blort", "bar")},
        missing(connections=[("blort", "bar")]),
    ),
    (
        "unresolvable connection in template",
        '{"foo": "${connections.blort.bar}"}',
        Data(),
        {"foo": "${connections.blort.bar}"},
        missing(connections=[("blort", "bar")]),
    ),
    (
        "unresolvable output",
        '{"foo": {"$type": "Output", "from": "baz", "name": "bar"}}',
        Data(),
        {"foo": output("baz", "bar")},
        missing(outputs=[("baz", "bar")]),
    ),
    (
        "unresolvable output in template",
        '{"foo": "${outputs.baz.bar}"}',
        Data(),
        {"foo": "${outputs.baz.bar}"},
        missing(outputs=[("baz", "bar")]),
    ),
    (
        "unresolvable parameter",
        '{"foo": {"$type": "Parameter", "name": "bar"}}',
        Data(),
        {"foo": parameter("bar")},
        missing(parameters=[("bar",)]),
    ),
    (
        "unresolvable parameter in template",
        '{"foo": "${parameters.bar}"}',
        Data(),
        {"foo": "${parameters.bar}"},
        missing(parameters=[("bar",)]),
    ),
    (
        "unresolvable at depth in template",
        '{"foo": [{"a": "${secrets.foo}"}, "${parameters.bar}"], "bar": "${parameters.frob}"}',
        Data(secrets={"foo": "x"}),
        {"foo": [{"a": "x"}, "${parameters.bar}"], "bar": "${parameters.frob}"},
        missing(parameters=[("bar",), ("frob",)]),
    ),
    (
        "resolvable",
        """{"a": {"$type": "Secret", "name": "foo"}, "b": {"$type": "Output", "from": "baz", "name": "bar"},
            "c": {"$type": "Parameter", "name": "quux"}, "d": {"$fn.foo": "bar"}, "e": "hello",
            "f": {"$type": "Answer", "askRef": "baz", "name": "bar"},
            "g": {"$type": "Data", "query": "foo.bar"},
            "h": {"$type": "Connection", "type": "blort", "name": "bar"}}""",
        FULL_DATA,
        {
            "a": "v3ry s3kr3t!",
            "b": "127.0.0.1",
            "c": [1, 2, 3],
            "d": "~~[bar]~~",
            "e": "hello",
            "f": "approved",
            "g": "baz",
            "h": {"bar": "blort"},
        },
        {},
    ),
    (
        "resolvable in template",
        """{"a": "${secrets.foo}", "b": "${outputs.baz.bar}", "c": "${parameters.quux}", "d": "${foo('bar')}",
            "e": "hello", "g": "${event.foo.bar}", "h": "${connections.blort.bar}"}""",
        FULL_DATA,
        {
            "a": "v3ry s3kr3t!",
            "b": "127.0.0.1",
            "c": [1, 2, 3],
            "d": "~~[bar]~~",
            "e": "hello",
            "g": "baz",
            "h": {"bar": "blort"},
        },
        {},
    ),
    (
        "resolvable expansion in template",
        '{"foo": "${$}"}',
        FULL_DATA,
        {
            "foo": {
                "secrets": {"foo": "v3ry s3kr3t!"},
                "outputs": {"baz": {"bar": "127.0.0.1"}},
                "parameters": {"quux": [1, 2, 3]},
                "event": {"foo": {"bar": "baz"}},
                "connections": {"blort": {"bar": {"bar": "blort"}}},
            }
        },
        {},
    ),
    (
        "resolvable parameter traversal",
        '{"accessKeyID": "${parameters.aws.accessKeyID}"}',
        Data(parameters={"aws": {"accessKeyID": "foo", "secretAccessKey": "bar"}}),
        {"accessKeyID": "foo"},
        {},
    ),
    (
        "resolvable output traversal",
        '{"test": "${outputs.baz.bar.b[1]}"}',
        Data(outputs={("baz", "bar"): {"a": "test", "b": ["c", "d"]}}),
        {"test": "d"},
        {},
    ),
    (
        "resolvable parameter in invocation argument",
        '{"aws": {"$fn.jsonUnmarshal": {"$type": "Parameter", "name": "aws"}}}',
        Data(parameters={"aws": '{"accessKeyID": "foo", "secretAccessKey": "bar"}'}),
        {"aws": {"accessKeyID": "foo", "secretAccessKey": "bar"}},
        {},
    ),
    (
        "resolvable parameter in invocation argument in partial template",
        '{"aws": {"$fn.jsonUnmarshal": "${parameters.aws}"}}',
        Data(parameters={"aws": '{"accessKeyID": "foo", "secretAccessKey": "bar"}'}),
        {"aws": {"accessKeyID": "foo", "secretAccessKey": "bar"}},
        {},
    ),
    (
        "resolvable parameter in invocation argument in template",
        '{"aws": "${jsonUnmarshal(parameters.aws)}"}',
        Data(parameters={"aws": '{"accessKeyID": "foo", "secretAccessKey": "bar"}'}),
        {"aws": {"accessKeyID": "foo", "secretAccessKey": "bar"}},
        {},
    ),
    (
        "unresolvable parameter in invocation argument",
        '{"aws": {"$fn.jsonUnmarshal": {"$type": "Parameter", "name": "aws"}}}',
        Data(),
        {"aws": invocation("jsonUnmarshal", [parameter("aws")])},
        missing(parameters=[("aws",)]),
    ),
    (
        "unresolvable parameter in invocation argument in partial template",
        '{"aws": {"$fn.jsonUnmarshal": "${parameters.aws}"}}',
        Data(),
        {"aws": invocation("jsonUnmarshal", ["${parameters.aws}"])},
        missing(parameters=[("aws",)]),
    ),
    (
        "unresolvable parameter in invocation argument in template",
        '{"aws": "${jsonUnmarshal(parameters.aws)}"}',
        Data(),
        {"aws": "${jsonUnmarshal(parameters.aws)}"},
        missing(parameters=[("aws",)]),
    ),
    (
        "partially resolvable invocation",
        '{"foo": {"$fn.concat": [{"$type": "Parameter", "name": "first"},'
        ' {"$type": "Parameter", "name": "second"}]}}',
        Data(parameters={"first": "bar"}),
        {"foo": invocation("concat", ["bar", parameter("second")])},
        missing(parameters=[("second",)]),
    ),
    (
        "partially resolvable invocation in partial template",
        '{"foo": {"$fn.concat": ["${parameters.first}", "${parameters.second}"]}}',
        Data(parameters={"first": "bar"}),
        {"foo": invocation("concat", ["bar", "${parameters.second}"])},
        missing(parameters=[("second",)]),
    ),
    (
        "partially resolvable invocation in template",
        '{"foo": "${concat(parameters.first, parameters.second)}"}',
        Data(parameters={"first": "bar"}),
        {"foo": "${concat(parameters.first, parameters.second)}"},
        missing(parameters=[("second",)]),
    ),
    (
        "successful invocation of fn.convertMarkdown to Jira syntax",
        '{"foo": {"$fn.convertMarkdown": ["jira", "--- `code` ---"]}}',
        Data(),
        {"foo": "\n----\n{code}code{code}\n----\n"},
        {},
    ),
    (
        "successful invocation of fn.convertMarkdown to Jira syntax in template",
        "{\"foo\": \"${convertMarkdown('jira', '--- `code` ---')}\"}",
        Data(),
        {"foo": "\n----\n{code}code{code}\n----\n"},
        {},
    ),
    (
        "unresolved conditionals evaluation",
        '{"conditions": [{"$fn.equals": [{"$type": "Parameter", "name": "first"}, "foobar"]}]}',
        Data(),
        {"conditions": [invocation("equals", [parameter("first"), "foobar"])]},
        missing(parameters=[("first",)]),
    ),
    (
        "unresolved conditionals evaluation in template",
        """{"conditions": ["${parameters.first == 'foobar'}"]}""",
        Data(),
        {"conditions": ["${parameters.first == 'foobar'}"]},
        missing(parameters=[("first",)]),
    ),
    (
        "resolved conditionals evaluation",
        """{"conditions": [{"$fn.equals": [{"$type": "Parameter", "name": "first"}, "foobar"]},
            {"$fn.notEquals": [{"$type": "Parameter", "name": "first"}, "barfoo"]}]}""",
        Data(parameters={"first": "foobar"}),
        {"conditions": [True, True]},
        {},
    ),
    (
        "resolved conditionals evaluation in template",
        """{"conditions": ["${parameters.first == 'foobar'}", "${parameters.first != 'barfoo'}"]}""",
        Data(parameters={"first": "foobar"}),
        {"conditions": [True, True]},
        {},
    ),
    (
        "complex conditionals",
        """"${parameters.comp == outputs.baz && outputs.baz.id < 'second'}\"""",
        Data(
            parameters={"comp": {"ip": "127.0.0.1", "id": "first"}},
            outputs={("baz", "ip"): "127.0.0.1", ("baz", "id"): "first"},
        ),
        True,
        {},
    ),
    (
        "encoded string",
        '{"foo": {"$encoding": "base64", "data": "SGVsbG8sIJCiikU="}}',
        Data(),
        {"foo": b"Hello, \x90\xa2\x8a\x45".decode("utf-8", "surrogateescape")},
        {},
    ),
    (
        "encoded string from secret in template",
        '{"foo": {"$encoding": "base64", "data": "${secrets.bar}"}}',
        Data(secrets={"bar": "SGVsbG8sIJCiikU="}),
        {"foo": b"Hello, \x90\xa2\x8a\x45".decode("utf-8", "surrogateescape")},
        {},
    ),
    (
        "encoded string from unresolvable secret",
        '{"foo": {"$encoding": "base64", "data": {"$type": "Secret", "name": "bar"}}}',
        Data(),
        {"foo": {"$encoding": "base64", "data": secret("bar")}},
        missing(secrets=[("bar",)]),
    ),
    ("invocation with array arguments", '{"$fn.foo": ["bar", "baz"]}', Data(), "~~[bar baz]~~", {}),
    (
        "invocation with array arguments in template",
        """"${foo('bar', 'baz')}\"""",
        Data(),
        "~~[bar baz]~~",
        {},
    ),
    (
        "invocation with object arguments",
        '{"$fn.foo": {"whiz": "bang", "not": "this"}}',
        Data(),
        "~~bang~~",
        {},
    ),
    (
        "invocation with object arguments in template",
        """"${foo(whiz: 'bang', not: 'this')}\"""",
        Data(),
        "~~bang~~",
        {},
    ),
    (
        "resolvable template dereferencing",
        """"${secrets['regions.' + parameters.region]}\"""",
        Data(
            parameters={"region": "us-east-1"},
            secrets={"regions.us-east-1": "EAST", "regions.us-west-1": "WEST"},
        ),
        "EAST",
        {},
    ),
    (
        "unresolvable template dereferencing",
        """"${secrets['regions.' + parameters.region]}\"""",
        Data(
            parameters={"region": "us-east-2"},
            secrets={"regions.us-east-1": "EAST", "regions.us-west-1": "WEST"},
        ),
        "${secrets['regions.' + parameters.region]}",
        missing(secrets=[("regions.us-east-2",)]),
    ),
    (
        "nested unresolvable template dereferencing",
        """"${secrets['regions.' + parameters.region]}\"""",
        Data(),
        "${secrets['regions.' + parameters.region]}",
        missing(parameters=[("region",)]),
    ),
    (
        "parameters expansion in template",
        '{"foo": "${parameters}"}',
        Data(parameters={"region": "us-east-1"}),
        {"foo": {"region": "us-east-1"}},
        {},
    ),
    (
        "secrets expansion in template",
        '{"foo": "${secrets}"}',
        Data(secrets={"a": "EAST"}),
        {"foo": {"a": "EAST"}},
        {},
    ),
    (
        "outputs expansion in template",
        '{"foo": "${outputs}"}',
        Data(outputs={("baz", "bar"): "127.0.0.1"}),
        {"foo": {"baz": {"bar": "127.0.0.1"}}},
        {},
    ),
    (
        "single step output expansion in template",
        '{"foo": "${outputs.baz}"}',
        Data(outputs={("baz", "bar"): "127.0.0.1"}),
        {"foo": {"bar": "127.0.0.1"}},
        {},
    ),
    (
        "connections expansion in template",
        '{"foo": "${connections}"}',
        Data(
            connections={
                ("blort", "bar"): {"bar": "blort"},
                ("zup", "bar"): {"waz": "mux"},
                ("blort", "wish"): {"sim": "jax"},
            }
        ),
        {"foo": {"blort": {"bar": {"bar": "blort"}, "wish": {"sim": "jax"}}, "zup": {"bar": {"waz": "mux"}}}},
        {},
    ),
    (
        "single connection type expansion in template",
        '{"foo": "${connections.blort}"}',
        Data(
            connections={
                ("blort", "bar"): {"bar": "blort"},
                ("zup", "bar"): {"waz": "mux"},
                ("blort", "wish"): {"sim": "jax"},
            }
        ),
        {"foo": {"bar": {"bar": "blort"}, "wish": {"sim": "jax"}}},
        {},
    ),
    (
        "template interpolation",
        '{"foo": "Hello, ${secrets.who}!"}',
        Data(secrets={"who": "friend"}),
        {"foo": "Hello, friend!"},
        {},
    ),
    (
        "template interpolation with mapping type",
        '{"foo": "Some secret people:\\n${secrets}"}',
        Data(secrets={"who": "friend"}),
        {"foo": 'Some secret people:\n{\n\t"who": "friend"\n}'},
        {},
    ),
    (
        "many unresolvable",
        """{"a": {"$type": "Secret", "name": "foo"}, "b": {"$type": "Output", "from": "baz", "name": "bar"},
            "c": {"$type": "Parameter", "name": "quux"}, "e": "hello",
            "f": {"$type": "Answer", "askRef": "baz", "name": "bar"},
            "g": {"$type": "Connection", "type": "blort", "name": "bar"}}""",
        Data(),
        {
            "a": secret("foo"),
            "b": output("baz", "bar"),
            "c": parameter("quux"),
            "e": "hello",
            "f": answer("baz", "bar"),
            "g": connection("blort", "bar"),
        },
        missing(
            secrets=[("foo",)],
            outputs=[("baz", "bar")],
            parameters=[("quux",)],
            answers=[("baz", "bar")],
            connections=[("blort", "bar")],
        ),
    ),
]


@pytest.mark.parametrize(
    ("data_json", "data", "value", "unresolvable"),
    [c[1:] for c in EVALUATE_CASES],
    ids=[c[0] for c in EVALUATE_CASES],
)
def test_evaluate(data_json: str, data: Data, value: Any, unresolvable: dict) -> None:
    tree = from_json(data_json)
    result = WorkflowEvaluator(data, functions=_foo_functions()).evaluate(Context(), tree, -1)
    assert result.value == value
    assert result.unresolvable.as_dict() == unresolvable


def test_an_unknown_function_is_unresolvable_not_an_error() -> None:
    for tree in ({"foo": {"$fn.foo": "bar"}}, {"foo": "${foo('bar')}"}):
        result = evaluate(tree)
        assert result.value == tree
        assert result.unresolvable.invocations == {("foo", "function not found")}


EVALUATE_ERRORS = [
    (
        "invalid data resolver in template",
        '{"baz": "${event.foo.bar}"}',
        'path "baz": evaluating template "${": path "event": unknown key event',
    ),
    (
        "invalid data",
        '{"foo": [{"$type": "Data"}]}',
        'path "foo.0": could not evaluate a Data type: the required field "query"',
    ),
    (
        "invalid secret",
        '{"foo": [{"$type": "Secret"}]}',
        'path "foo.0": could not evaluate a Secret type: the required field "name"',
    ),
    ("invalid connection", '{"foo": [{"$type": "Connection", "name": "foo"}]}', 'the required field "type"'),
    ("invalid output", '{"foo": [{"$type": "Output", "name": "foo"}]}', 'the required field "from"'),
    ("invalid parameter", '{"foo": [{"$type": "Parameter"}]}', 'the required field "name"'),
    (
        "invalid encoding",
        '{"foo": [{"$encoding": "base32", "data": "nooo"}]}',
        'could not evaluate encoding "base32"',
    ),
    (
        "bad invocation",
        '{"$fn.append": [1, 2, 3]}',
        'invocation of function "append" failed: '
        "fn: arg 1: fn: unexpected type float64 (wanted []interface {})",
    ),
    (
        "bad invocation in template",
        '"${append(1, 2, 3)}"',
        'invocation of function "append" failed: '
        "fn: arg 1: fn: unexpected type float64 (wanted []interface {})",
    ),
]


@pytest.mark.parametrize(
    ("data_json", "error"), [c[1:] for c in EVALUATE_ERRORS], ids=[c[0] for c in EVALUATE_ERRORS]
)
def test_evaluate_errors(data_json: str, error: str) -> None:
    with pytest.raises(EvaluationError) as raised:
        evaluate(from_json(data_json))
    assert error in str(raised.value)


def test_a_data_query_error_says_which_query() -> None:
    with pytest.raises(EvaluationError, match=r'query "fo\{o\.b\}ar"'):
        evaluate({"data": {"$type": "Data", "query": "fo{o.b}ar"}}, Data(event={"foo": {"bar": "baz"}}))


# evaluate/evaluate_test.go: TestEvaluateQuery (the path language) and TestEvaluatePath ---------

QUERY_CASES = [
    ("literal", {"foo": "bar"}, "foo", Data(), "bar", {}, ""),
    (
        "nonexistent key",
        {"foo": [{"bar": "baz"}]},
        "foo[0].quux",
        Data(),
        None,
        {},
        'path "foo.0.quux": unknown key quux',
    ),
    (
        "nonexistent index",
        {"foo": [{"bar": "baz"}]},
        "foo[1].quux",
        Data(),
        None,
        {},
        'path "foo.1": index 1 out of bounds',
    ),
    (
        "traverses parameter",
        {"foo": parameter("bar")},
        "foo.bar.baz",
        Data(parameters={"bar": {"bar": {"baz": "quux"}}}),
        "quux",
        {},
        "",
    ),
    (
        "unresolvable",
        {"foo": parameter("bar")},
        "foo.bar.baz",
        Data(),
        None,
        missing(parameters=[("bar",)]),
        "",
    ),
    (
        "unresolvable not evaluated because not in path",
        {"a": parameter("bar"), "b": {"c": secret("foo")}},
        "b.c",
        Data(secrets={"foo": "very secret"}),
        "very secret",
        {},
        "",
    ),
    (
        "query has an error under a path",
        {"foo": {"bar": ["baz", "quux"]}},
        "foo.bar[0].nope",
        Data(),
        None,
        {},
        'path "foo.bar.0.nope": unsupported value type string for select of field nope',
    ),
]


@pytest.mark.parametrize(
    ("tree", "query", "data", "value", "unresolvable", "error"),
    [c[1:] for c in QUERY_CASES],
    ids=[c[0] for c in QUERY_CASES],
)
def test_evaluate_query(
    tree: Any, query: str, data: Data, value: Any, unresolvable: dict, error: str
) -> None:
    # As the step runtime API runs a query: over the tree evaluated once, as data.
    settled = WorkflowEvaluator(data).settle(Context(), tree)
    if error:
        with pytest.raises(EvaluationError) as raised:
            expr.evaluate_query(Context(), settled, query)
        assert error in str(raised.value)
        return
    result = expr.evaluate_query(Context(), settled, query)
    assert result.value == value
    assert result.unresolvable.as_dict() == unresolvable


# Data is data: what a reference, template or call yields is never evaluated again ------------

HOSTILE = "${secrets.x} ${connections.slack.x.apiToken}"
HOSTILE_MAP = {"text": HOSTILE, "ref": {"$type": "Secret", "name": "x"}, "fn": {"$fn.now": []}}
DATA_CASES = [
    ("a parameter", parameter("p"), HOSTILE),
    ("a template", "${parameters.p}", HOSTILE),
    ("a template's text", "at ${parameters.p}", "at " + HOSTILE),
    ("an output", output("a", "o"), HOSTILE_MAP),
    ("a path into an output", invocation("path", [output("a", "o"), "text"]), HOSTILE),
    (
        "a path to a reference in data",
        invocation("path", {"object": output("a", "o"), "query": "ref"}),
        HOSTILE_MAP["ref"],
    ),
    ("a path in a template", "${path(outputs.a.o, 'ref')}", HOSTILE_MAP["ref"]),
    ("a function's arguments from a parameter", invocation("concat", parameter("list")), HOSTILE + "!"),
    (
        "a function's keyword arguments from a parameter",
        invocation("merge", parameter("objects")),
        HOSTILE_MAP,
    ),
    ("a function's one argument from a template", invocation("toString", "${parameters.p}"), HOSTILE),
    (
        "a function's arguments from a call",
        invocation("coalesce", invocation("jsonUnmarshal", [parameter("json")])),
        HOSTILE,
    ),
    ("a merge of data", invocation("merge", [output("a", "o"), {"more": 1}]), {**HOSTILE_MAP, "more": 1}),
    ("event data", {"$type": "Data", "query": "title"}, HOSTILE),
    ("a path into event data", invocation("path", [{"$type": "Data", "query": "pr"}, "title"]), HOSTILE),
]


@pytest.mark.parametrize(("tree", "value"), [c[1:] for c in DATA_CASES], ids=[c[0] for c in DATA_CASES])
def test_what_arrives_as_data_is_never_evaluated_again(tree: Any, value: Any) -> None:
    """The data holds text that reads a secret and a connection, and a `$type` map, were
    they evaluated; the run has neither to give (so an evaluation of them would be
    incomplete), and the result is the data as it is."""
    data = Data(
        parameters={
            "p": HOSTILE,
            "list": [HOSTILE, "!"],
            "objects": {"objects": [HOSTILE_MAP]},
            "json": f'["{HOSTILE}"]',
        },
        outputs={("a", "o"): HOSTILE_MAP},
        event={"title": HOSTILE, "pr": {"title": HOSTILE}},
        event_available=True,
    )
    result = evaluate({"v": tree}, data)
    assert result.unresolvable.as_dict() == {}
    assert result.value == {"v": value}
    # And over the value a step's spec settles into (the step runtime API's queries).
    settled = WorkflowEvaluator(data).settle(Context(), {"v": tree})
    assert expr.evaluate_query(Context(), settled, "v").value == value


AWS_CONNECTION = {
    "aws": {
        "accessKeyID": {"$fn.path": {"object": connection("aws", "aws"), "query": "accessKeyID"}},
        "secretAccessKey": {"$fn.path": {"object": connection("aws", "aws"), "query": "secretAccessKey"}},
        "region": "us-west-2",
    }
}
AWS_SECRET = {
    "aws": {
        "accessKeyID": {
            "$fn.path": {"object": invocation("jsonUnmarshal", [secret("aws")]), "query": "accessKeyID"}
        },
        "secretAccessKey": {
            "$fn.path": {"object": invocation("jsonUnmarshal", [secret("aws")]), "query": "secretAccessKey"}
        },
        "region": "us-west-2",
    }
}
AWS_RESOLVED = {
    "aws": {"accessKeyID": "AKIANOAHISCOOL", "secretAccessKey": "abcdefs3cr37s", "region": "us-west-2"}
}


@pytest.mark.parametrize(
    ("tree", "data", "value", "unresolvable"),
    [
        (
            AWS_CONNECTION,
            Data(
                connections={
                    ("aws", "aws"): {"accessKeyID": "AKIANOAHISCOOL", "secretAccessKey": "abcdefs3cr37s"}
                }
            ),
            AWS_RESOLVED,
            {},
        ),
        (AWS_CONNECTION, Data(), AWS_CONNECTION, missing(connections=[("aws", "aws")])),
        (
            AWS_SECRET,
            Data(secrets={"aws": '{"accessKeyID": "AKIANOAHISCOOL", "secretAccessKey": "abcdefs3cr37s"}'}),
            AWS_RESOLVED,
            {},
        ),
        (AWS_SECRET, Data(), AWS_SECRET, missing(secrets=[("aws",)])),
    ],
    ids=[
        "resolvable (connections)",
        "unresolvable (connections)",
        "resolvable (secrets)",
        "unresolvable (secrets)",
    ],
)
def test_evaluate_path(tree: Any, data: Data, value: Any, unresolvable: dict) -> None:
    result = evaluate(tree, data)
    assert result.value == value
    assert result.unresolvable.as_dict() == unresolvable


# fnlib/*_test.go ----------------------------------------------------------------------------------


def invoke(name: str, args: list[Any] | dict[str, Any], data: Data | None = None) -> Result:
    evaluator = WorkflowEvaluator(data or Data())
    descriptor = LIBRARY[name]
    invoker = (
        descriptor.keyword(evaluator, args)
        if isinstance(args, dict)
        else descriptor.positional(evaluator, args)
    )
    return invoker(Context())


def test_append() -> None:
    result = invoke("append", [[1, 2], 3, 4])
    assert result.complete and result.value == [1, 2, 3, 4]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([None, 3, 4], 3),
        ([unresolved(parameters={("foo",)}), 3, 4], 3),
        ([1, None], 1),
        ([], None),
        ([None, unresolved(parameters={("foo",)})], None),
    ],
    ids=[
        "null then values",
        "unresolvable then values",
        "values first",
        "no arguments",
        "no unresolvable or non-null values",
    ],
)
def test_coalesce(args: list[Any], expected: Any) -> None:
    result = invoke("coalesce", args)
    assert result.complete and result.value == expected


@pytest.mark.parametrize(
    ("args", "expected"),
    [([], ""), (["Hello, ", "world!"], "Hello, world!"), (["H", 3, "llo, world!"], "H3llo, world!")],
    ids=["empty", "basic", "type conversion"],
)
def test_concat(args: list[Any], expected: str) -> None:
    result = invoke("concat", args)
    assert result.complete and result.value == expected


def test_convert_markdown_to_jira() -> None:
    markdown = (
        "%%% @contact [![imageTitle](imageUrl)](imageRedirect) "
        "`data{context} > threshold` Detailed description. "
        "- - - [[linkTitle1](link1)] · [[linkTitle2](link2)] %%%"
    )
    expected = (
        "@contact \n\n[!imageUrl!|imageRedirect] {code}data{context} > threshold{code} Detailed description."
        "\n----\n[[linkTitle1|link1]] · [[linkTitle2|link2]]"
    )
    assert invoke("convertMarkdown", ["jira", markdown]).value == expected
    assert invoke("convertMarkdown", {"to": "jira", "content": markdown}).value == expected


def test_convert_markdown_to_html() -> None:
    assert convert_markdown("html", "Hello *there*") == "<p>Hello <em>there</em></p>\n"


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"to": "foo", "content": "bar"}, "convert: type not supported"),
        ({"to": False, "content": "bar"}, 'fn: arg "to": fn: unexpected type bool (wanted string)'),
        ({"to": "jira", "content": False}, 'fn: arg "content": fn: unexpected type bool (wanted string)'),
    ],
    ids=["unsupported convert type", "invalid to keyword type", "invalid content keyword type"],
)
def test_convert_markdown_errors(args: dict, error: str) -> None:
    with pytest.raises(EvaluationError) as raised:
        invoke("convertMarkdown", args)
    assert str(raised.value) == error


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"content": "bar"}, 'fn: arg "to": fn: arg not found'),
        ({"to": "jira"}, 'fn: arg "content": fn: arg not found'),
    ],
    ids=["missing to keyword", "missing content"],
)
def test_convert_markdown_missing_keywords(args: dict, error: str) -> None:
    with pytest.raises(ArgumentError) as raised:
        invoke("convertMarkdown", args)
    assert str(raised.value) == error


EQUALS_CASES = [
    ("equals", ["foobar", "foobar"], True),
    ("equals", [10, 10], True),
    ("equals", [10.5, 10.5], True),
    ("equals", [["foo", "bar"], ["foo", "bar"]], True),
    ("equals", [[1, 2], [1, 2]], True),
    ("equals", [[1.1, 2.0], [1.1, 2.0]], True),
    ("equals", [{"foo": "bar"}, {"foo": "bar"}], True),
    ("equals", ["true", True], False),
    ("equals", ["10", 10], False),
    ("equals", [10.5, 10], False),
    ("equals", [1, 2], False),
    ("notEquals", ["foobar", "barfoo"], True),
    ("notEquals", [10, 50], True),
    ("notEquals", [10.0, 50.5], True),
    ("notEquals", [["foo", "bar", "baz"], ["foo", "bar"]], True),
    ("notEquals", [[1, 2, 3], [1, 2]], True),
    ("notEquals", [[1.1, 2.0, 3.2], [1.1, 2.0]], True),
    ("notEquals", [{"foo": "bar", "baz": "biz"}, {"foo": "bar"}], True),
    ("notEquals", [True, True], False),
    ("notEquals", [10, 10], False),
    ("notEquals", ["foobar", "foobar"], False),
]


@pytest.mark.parametrize(("name", "args", "expected"), EQUALS_CASES)
def test_equals_and_not_equals_compare_type_and_value(name: str, args: list[Any], expected: bool) -> None:
    result = invoke(name, args)
    assert result.complete and result.value is expected


@pytest.mark.parametrize("name", ["equals", "notEquals"])
def test_equals_takes_two_arguments(name: str) -> None:
    with pytest.raises(ArgumentError, match=r"fn: unexpected number of arguments: 3 \(wanted 2\)"):
        invoke(name, [1, 2, 3])


def test_json_unmarshal_and_marshal() -> None:
    assert invoke("jsonUnmarshal", ['{"foo": "bar"}']).value == {"foo": "bar"}
    assert invoke("jsonMarshal", [{"foo": ["bar"], "a<b": 1.0}]).value == '{"a\\u003cb":1,"foo":["bar"]}'


MERGE_A = {"a": "b", "c": {"d": "e"}}


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            [MERGE_A, {"a": "overwritten", "c": {"f": "added"}}],
            {"a": "overwritten", "c": {"d": "e", "f": "added"}},
        ),
        (
            {"objects": [MERGE_A, {"a": "overwritten", "c": {"f": "added"}}]},
            {"a": "overwritten", "c": {"d": "e", "f": "added"}},
        ),
        (
            {"objects": [MERGE_A, {"a": "overwritten", "c": {"f": "overwritten"}}], "mode": "shallow"},
            {"a": "overwritten", "c": {"f": "overwritten"}},
        ),
    ],
    ids=["positional", "keyword deep", "keyword shallow"],
)
def test_merge(args: Any, expected: dict) -> None:
    result = invoke("merge", args)
    assert result.complete and result.value == expected


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            {"objects": [MERGE_A], "mode": "secret"},
            'fn: arg "mode": unexpected value "secret", wanted one of "deep" or "shallow"',
        ),
        ([MERGE_A, "hello"], "fn: arg 2: fn: unexpected type string (wanted map[string]interface {})"),
    ],
    ids=["invalid mode", "merge candidate is not a map"],
)
def test_merge_errors(args: Any, error: str) -> None:
    with pytest.raises(EvaluationError) as raised:
        invoke("merge", args)
    assert str(raised.value) == error


PATH_CASES = [
    ("path exists", {"foo": {"bar": "baz"}}, "foo.bar", None, Data(), "baz", False, ""),
    (
        "path does not exist",
        {"foo": {"bar": "baz"}},
        "foo.quux",
        None,
        Data(),
        None,
        False,
        'path "foo.quux": unknown key quux',
    ),
    ("path exists with default", {"foo": {"bar": "baz"}}, "foo.bar", "quux", Data(), "baz", False, ""),
    ("path does not exist with default", {"foo": {"bar": "baz"}}, "foo.quux", 42, Data(), 42, False, ""),
    (
        "path is resolvable (using secrets) and path exists",
        {"foo": {"bar": invocation("jsonUnmarshal", [secret("blort")])}},
        "foo.bar.grault.garply",
        None,
        Data(secrets={"blort": '{"grault": {"garply": "xyzzy"}}'}),
        "xyzzy",
        False,
        "",
    ),
    (
        "path is resolvable (using secrets) and path does not exist",
        {"foo": {"bar": invocation("jsonUnmarshal", [secret("blort")])}},
        "foo.baz.grault.garply",
        "xyzzy",
        Data(secrets={"blort": '{"grault": {"garply": "xyzzy"}}'}),
        "xyzzy",
        False,
        "",
    ),
    (
        "path is not resolvable (using secrets)",
        {"foo": {"bar": invocation("jsonUnmarshal", [secret("blort")])}},
        "foo.bar.grault",
        None,
        Data(),
        None,
        True,
        "",
    ),
    (
        "path is resolvable (using connections) and path exists",
        {"foo": {"bar": connection("blort", "bar")}},
        "foo.bar.grault",
        None,
        Data(connections={("blort", "bar"): {"quuz": "quux", "grault": "garply"}}),
        "garply",
        False,
        "",
    ),
    (
        "path is resolvable (using connections) and path does not exist",
        {"foo": {"baz": connection("blort", "bar")}},
        "foo.bar.grault",
        "xyzzy",
        Data(connections={("blort", "bar"): {"quuz": "quux", "grault": "garply"}}),
        "xyzzy",
        False,
        "",
    ),
    (
        "path is not resolvable (using connections)",
        {"foo": {"bar": connection("blort", "bar")}},
        "foo.bar.grault",
        "xyzzy",
        Data(),
        None,
        True,
        "",
    ),
    (
        "path is resolvable (using parameters) and path exists",
        {"foo": {"bar": parameter("quux")}},
        "foo.bar",
        None,
        Data(parameters={"quux": "baz"}),
        "baz",
        False,
        "",
    ),
    (
        "path and query are resolvable (using parameters) and path exists",
        {"foo": {"bar": parameter("quux")}},
        parameter("quuz"),
        None,
        Data(parameters={"quux": "baz", "quuz": "foo.bar"}),
        "baz",
        False,
        "",
    ),
    (
        "path is resolvable (using parameters) and path does not exist",
        {"foo": {"quuz": parameter("quux")}},
        "foo.bar",
        "grault",
        Data(parameters={"quux": "baz"}),
        "grault",
        False,
        "",
    ),
    (
        "path and default are resolvable (using parameters) and path does not exist",
        {"foo": {"quuz": parameter("quux")}},
        "foo.bar",
        parameter("grault"),
        Data(parameters={"quux": "baz", "grault": "garply"}),
        "garply",
        False,
        "",
    ),
    (
        "path is not resolvable (using parameters)",
        {"foo": {"bar": parameter("quux")}},
        "foo.bar",
        None,
        Data(),
        None,
        True,
        "",
    ),
    (
        "path is not resolvable (using parameters) with default",
        {"foo": {"bar": parameter("quux")}},
        "foo.bar",
        42,
        Data(),
        None,
        True,
        "",
    ),
    (
        "path is resolvable (using parameters) but object is not completely resolvable",
        {"foo": {"bar": parameter("quux"), "baz": "ok"}},
        "foo.baz",
        "ok",
        Data(),
        "ok",
        False,
        "",
    ),
    ("query is not resolvable", {"foo": {"bar": "baz"}}, parameter("wut"), None, Data(), None, True, ""),
    (
        "default is not resolvable",
        {"foo": {"bar": "baz"}},
        "foo.quux",
        parameter("wut"),
        Data(),
        None,
        True,
        "",
    ),
    (
        "object is unsupported type (nil)",
        None,
        "foo.bar",
        "bar",
        Data(),
        None,
        False,
        'path "foo": unsupported value type <nil> for select of field foo',
    ),
]


@pytest.mark.parametrize("form", ["positional", "keyword"])
@pytest.mark.parametrize(
    ("obj", "query", "default", "data", "value", "incomplete", "error"),
    [c[1:] for c in PATH_CASES],
    ids=[c[0] for c in PATH_CASES],
)
def test_path(
    obj: Any, query: Any, default: Any, data: Data, value: Any, incomplete: bool, error: str, form: str
) -> None:
    if form == "positional":
        args: Any = [obj, query] + ([default] if default is not None else [])
        arg = "fn: arg 1: "
    else:
        args = {"object": obj, "query": query, **({"default": default} if default is not None else {})}
        arg = 'fn: arg "object": '
    if error:
        with pytest.raises(EvaluationError) as raised:
            invoke("path", args, data)
        assert str(raised.value) == arg + error
        return
    result = invoke("path", args, data)
    assert result.complete is not incomplete
    if incomplete:
        # What could not be resolved is the arguments, evaluated as far as they go.
        evaluator = WorkflowEvaluator(data)
        items = args.items() if isinstance(args, dict) else enumerate(args)
        expected = {k: evaluate_all(Context(), evaluator, v).value for k, v in items}
        assert result.value == (expected if isinstance(args, dict) else list(expected.values()))
    else:
        assert result.value == value


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("foo", "foo"),
        (b"foo", "foo"),
        (True, "true"),
        (None, ""),
        (42, "42"),
        (42.424242, "42.424242"),
        (datetime(1970, 1, 1, tzinfo=UTC), "1970-01-01T00:00:00Z"),
    ],
    ids=["string", "bytes", "boolean", "null", "integer", "decimal", "time"],
)
def test_to_string(value: Any, expected: str) -> None:
    result = invoke("toString", [value])
    assert result.complete and result.value == expected


def test_to_string_refuses_a_map() -> None:
    with pytest.raises(EvaluationError, match=r"fn: arg 1: fn: unexpected type map\[string\]interface \{\}"):
        invoke("toString", [{"foo": "bar"}])


@pytest.mark.parametrize(
    ("expression", "parameter", "expected", "error"),
    [
        ("foo", {"foo": "bar"}, True, ""),
        ("foo.bar", {"foo": {"baz": "quux"}}, False, ""),
        ("foo.bar.baz", {"foo": {"baz": "quux"}}, False, ""),
        ("foo[1].bar", {"foo": [{"baz": "quux"}]}, False, ""),
        ("foo.bar", {"foo": "bar"}, None, "unsupported value type string"),
    ],
    ids=["basic", "missing key", "missing key at depth", "index out of bounds", "invalid type"],
)
def test_exists(expression: str, parameter: Any, expected: Any, error: str) -> None:
    node = expr.parse_expression(expression, expr.Options())
    argument = expr.EvalExpandable(node, parameter)
    if error:
        with pytest.raises(EvaluationError, match=error):
            invoke("exists", [argument])
        return
    result = invoke("exists", [argument])
    assert result.complete and result.value is expected


def test_now_reads_the_clock() -> None:
    ctx = Context(clock=lambda: NOW)
    assert LIBRARY["now"].positional(DEFAULT_EVALUATOR, [])(ctx).value == NOW


# YAML scalars resolve as yaml.v3 resolves them for relay-core ------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("yes", "yes"),
        ("on", "on"),
        ("True", True),
        ("~", None),
        ("0777", 511),
        ("0o17", 15),
        ("0x1F", 31),
        ("1_000", 1000),
        ("08", 8.0),
        (".5", 0.5),
        ("1e3", 1000.0),
        ("2001-12-14", "2001-12-14"),
        ("'123'", "123"),
        ("!!str 123", "123"),
        ("!!float 1", 1.0),
    ],
)
def test_scalars_resolve_as_yaml_v3_does(text: str, value: Any) -> None:
    got = load(f"v: {text}").raw["v"]
    assert got == value and type(got) is type(value)


def test_a_tag_on_a_scalar_re_resolves_its_text_as_relay_core_does() -> None:
    assert load("v: !Parameter 5").tree["v"] == {"$type": "Parameter", "name": 5}
    assert load('v: !Fn.jsonUnmarshal "true"').tree["v"] == {"$fn.jsonUnmarshal": [True]}


def test_anchors_aliases_and_merge_keys() -> None:
    document = load(
        textwrap.dedent(
            """\
            base: &base {a: 1, b: 2}
            copy: *base
            merged:
              <<: *base
              b: 3
            """
        )
    )
    assert document.raw == {"base": {"a": 1, "b": 2}, "copy": {"a": 1, "b": 2}, "merged": {"a": 1, "b": 3}}
