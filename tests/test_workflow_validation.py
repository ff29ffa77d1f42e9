"""The checks beyond relay-core's schema, the errors' places and messages, and the loader's
bounds on untrusted documents."""

import textwrap
import time
from pathlib import Path

import pytest

from workflows.dialect.validate import FAST_VALIDATOR, VALIDATOR, Validation, parse, schema_problems, validate
from workflows.dialect.yamlload import MAX_BYTES, load

FIXTURES = Path(__file__).parent / "fixtures"


def check(source: str) -> Validation:
    return validate(textwrap.dedent(source))


def errors(source: str) -> list[tuple[str, int | None, str]]:
    return [(p.pointer, p.line, p.detail) for p in check(source).problems]


def test_a_valid_workflow_has_no_problems_and_its_graph() -> None:
    result = check(
        """\
        apiVersion: v1
        parameters:
          env: {default: staging}
        steps:
        - name: build
          image: alpine
        - name: test
          image: alpine
          spec:
            artifact: ${outputs.build.artifact}
        - name: gate
          type: approval
          dependsOn: test
        - name: cleanup
          image: alpine
          when: !Fn.equals [!Status test, failure]
        - name: deploy
          image: alpine
          dependsOn: [gate]
          spec:
            env: !Parameter env
            tag: !Output [build, tag]
        """
    )
    assert result.valid and result.warnings == []
    workflow = result.workflow
    assert workflow is not None
    assert dict(workflow.graph) == {
        "build": (),
        "test": ("build",),
        "gate": ("test",),
        "cleanup": ("test",),
        "deploy": ("gate", "build"),
    }
    assert workflow.step("cleanup").needs == () and workflow.step("cleanup").status_of == ("test",)
    assert workflow.step("deploy").depends_on == ("gate",) and workflow.step(
        "deploy"
    ).implicit_depends_on == ("build",)
    assert workflow.order().index("build") < workflow.order().index("test") < workflow.order().index("deploy")
    assert workflow.references.outputs == {("build", "artifact"), ("build", "tag")}
    assert workflow.references.parameters == {"env"}


def test_step_names_are_unique() -> None:
    assert errors(
        """\
        steps:
        - {name: a, image: alpine}
        - {name: a, image: alpine}
        """
    ) == [("#/steps/1/name", 3, "Another step is already named 'a' (steps[0]); step names must be unique.")]


def test_a_step_name_has_no_slash_since_it_is_a_part_of_the_step_s_urls() -> None:
    # …/steps/<name>/log and the run page's links: a name with a slash was a page that failed.
    assert errors(
        """\
        steps:
        - {name: deploy/web, image: alpine}
        """
    ) == [
        (
            "#/steps/0/name",
            2,
            "A step's name is part of its URLs (…/steps/<name>/log): it cannot hold '/'.",
        )
    ]
    stored = "steps:\n- {name: deploy/web, image: alpine}\n"
    assert validate(stored, stored=True).workflow is not None  # a revision saved before still reads


def test_trigger_names_are_unique() -> None:
    problems = errors(
        """\
        triggers:
        - {name: t, source: {type: push}}
        - {name: t, source: {type: push}}
        """
    )
    assert [p[0] for p in problems] == ["#/triggers/1/name"]


def test_depends_on_names_an_existing_step() -> None:
    assert errors(
        """\
        steps:
        - name: a
          image: alpine
          dependsOn: [b, a]
        """
    ) == [
        ("#/steps/0/dependsOn/0", 4, "dependsOn names 'b', which is not a step of this workflow."),
        ("#/steps/0/dependsOn/1", 4, "The step 'a' cannot depend on itself."),
    ]


def test_cycles_are_rejected_with_the_steps_in_them() -> None:
    problems = errors(
        """\
        steps:
        - {name: a, image: alpine, dependsOn: c}
        - {name: b, image: alpine, dependsOn: a}
        - name: c
          image: alpine
          spec: {x: !Output [b, out]}
        """
    )
    assert len(problems) == 1
    pointer, _, detail = problems[0]
    assert pointer.startswith("#/steps/")
    assert "cycle" in detail and all(f"{n}" in detail for n in "abc")


@pytest.mark.parametrize(
    ("spec", "detail"),
    [
        (
            "!Output [nope, x]",
            "The output reference names the step 'nope', which is not a step of this workflow.",
        ),
        (
            "${outputs.nope.x}",
            "The output reference names the step 'nope', which is not a step of this workflow.",
        ),
        (
            "${outputs['nope'].x}",
            "The output reference names the step 'nope', which is not a step of this workflow.",
        ),
        ("!Parameter undeclared", "!Parameter names 'undeclared', which is not declared under parameters."),
        (
            "${parameters.undeclared}",
            "${parameters.undeclared} names 'undeclared', which is not declared under parameters.",
        ),
        (
            "!Data host",
            "!Data reads the event that triggered the run: use it in a trigger's when or binding.",
        ),
        ("${event.host}", "${event.host}: event data exists only in a trigger's when and binding."),
        (
            "${foo.bar}",
            "${foo.bar}: 'foo' is not a name in a step; "
            "the names are secrets, connections, outputs, parameters.",
        ),
        ("!Status nope", "!Status names the step 'nope', which is not a step of this workflow."),
        ("!Output [s, x]", "A step cannot use its own outputs ('s')."),
        ("${concat(", "The expression cannot be read"),
        ("${a[\u00b2]}", "The expression cannot be read: unexpected '\u00b2'"),
        ("${append(1, 2)}", "This expression fails whatever the data"),
    ],
)
def test_references_and_expressions_in_a_step_are_checked(spec: str, detail: str) -> None:
    problems = errors(f"steps:\n- name: s\n  image: alpine\n  spec:\n    x: {spec}\n")
    assert len(problems) == 1, problems
    assert problems[0][0] == "#/steps/0/spec/x" and problems[0][1] == 5
    assert problems[0][2].startswith(detail)


@pytest.mark.parametrize(
    ("when", "detail"),
    [
        ("!Output [s, x]", "!Output refers to a step, and a trigger runs before any step."),
        (
            "${outputs.s.x}",
            "${outputs.s.x}: outputs are not available in a trigger; a trigger sees the event.",
        ),
        (
            "${parameters.p}",
            "${parameters.p}: parameters are not available in a trigger; a trigger sees the event.",
        ),
    ],
)
def test_a_trigger_sees_only_the_event(when: str, detail: str) -> None:
    problems = errors(
        f"parameters: {{p: {{}}}}\ntriggers:\n- name: t\n  source: {{type: push}}\n  when: {when}\n"
        "steps:\n- {name: s, image: alpine}\n"
    )
    assert [(p[0], p[2][: len(detail)]) for p in problems] == [("#/triggers/0/when", detail)]


def test_a_trigger_binds_declared_parameters_from_the_event() -> None:
    assert check(
        """\
        parameters: {host: {}}
        triggers:
        - name: t
          source: {type: push}
          when: ${event.noop == true}
          binding:
            parameters:
              host: !Data host
        """
    ).valid


def test_a_binding_of_an_undeclared_parameter_is_a_warning_and_left_out() -> None:
    # relay-core adds it to the run's parameters; the published datadog-to-slack binds
    # eventDate without declaring it. No step may name it here, so the trigger drops it.
    result = check(
        """\
        parameters: {title: {}}
        triggers:
        - name: t
          source: {type: push}
          binding:
            parameters:
              title: !Data title
              date: !Data date
        """
    )
    assert result.valid and result.workflow is not None
    assert [(w.pointer, w.line, w.detail) for w in result.warnings] == [
        (
            "#/triggers/0/binding/parameters/date",
            8,
            "The binding sets 'date', which is not a parameter of this workflow, so no step can "
            "read it and it is left out; declare it under parameters to use it.",
        )
    ]
    (trigger,) = result.workflow.triggers
    assert dict(trigger.binding_parameters) == {"title": {"$type": "Data", "query": "title"}}


@pytest.mark.parametrize(
    ("spec", "detail"),
    [
        (
            "${equals(1)}",
            "equals() cannot be called like this: fn: unexpected number of arguments: 1 (wanted 2)",
        ),
        (
            "!Fn.equals [a]",
            "equals() cannot be called like this: fn: unexpected number of arguments: 1 (wanted 2)",
        ),
        ("!Fn.path {query: a}", 'path() cannot be called like this: fn: arg "object": fn: arg not found'),
        # terraform-continuous-deployment's: a plain map is a keyword call, and merge's keyword
        # form takes `objects` (relay-core's fnlib/merge.go).
        (
            "!Fn.merge {name: a, branch: !Parameter p}",
            'merge() cannot be called like this: fn: arg "objects"',
        ),
    ],
)
def test_a_function_called_with_arguments_it_cannot_take_is_a_warning(spec: str, detail: str) -> None:
    # relay-core's evaluator makes a call its descriptor refuses an unresolvable invocation,
    # as it does an unknown function's (evaluate/mapping.go, pathlang/ident.go): the document
    # is valid there, and what evaluates the call never completes.
    result = check(f"parameters: {{p: {{}}}}\nsteps:\n- name: s\n  image: alpine\n  spec:\n    x: {spec}\n")
    assert result.valid, result.problems
    assert [(w.pointer, w.line) for w in result.warnings] == [("#/steps/0/spec/x", 6)]
    assert result.warnings[0].detail.startswith(detail)
    assert "relay-core accepts it, but it is never resolved" in result.warnings[0].detail


def test_tags_outside_evaluated_places_are_rejected() -> None:
    assert errors("steps:\n- name: s\n  image: !Parameter img\n") == [
        (
            "#/steps/0/image",
            3,
            "!Parameter is evaluated only in a step's spec, env and when, and a trigger's when and binding; "
            "here it would be read as plain text.",
        )
    ]


def test_an_expression_that_reads_data_is_not_judged_by_the_dry_run() -> None:
    # With p set, coalesce never evaluates append(1, 2); without it, it does and fails.
    assert check(
        """\
        parameters: {p: {}}
        steps:
        - name: s
          image: alpine
          spec:
            x: ${coalesce(parameters.p, append(1, 2))}
        triggers:
        - name: t
          source: {type: push}
          when: ${event}
        """
    ).valid


def test_an_unknown_function_is_a_warning() -> None:
    result = check("steps:\n- name: s\n  image: alpine\n  spec: {x: !Fn.shout [hi]}\n")
    assert result.valid
    assert [(w.pointer, w.detail.split(";")[0]) for w in result.warnings] == [
        ("#/steps/0/spec/x", "There is no function 'shout' here")
    ]


def test_schema_errors_point_at_the_place() -> None:
    assert errors("apiVersion: v2\nsteps:\n- name: s\n") == [
        ("#/apiVersion", 1, "apiVersion must be 'v1', not 'v2'."),
        ("#/steps/0", 3, "A container step (or webhook trigger) needs an 'image'."),
    ]
    assert errors("homepage: not a url\n") == [
        ("#/homepage", 1, "homepage must be a URL with a scheme, such as https://example.com/.")
    ]
    assert errors("- a list\n") == [
        ("#", 1, "A workflow is a mapping (apiVersion, parameters, steps, triggers), not a list.")
    ]


def test_spec_must_be_a_mapping() -> None:
    assert errors("steps:\n- name: s\n  image: alpine\n  spec: [a]\n") == [
        ("#/steps/0/spec", 4, "spec must be a mapping of names to values.")
    ]


def test_yaml_errors_say_where() -> None:
    problems = errors("steps:\n- name: a\n  image: [alpine\n")
    assert len(problems) == 1 and problems[0][0] == "#" and problems[0][1] == 4
    assert problems[0][2].startswith("The YAML cannot be read")
    assert errors("a: 1\na: 2\n") == [("#/a", 2, "The key 'a' is already defined on line 1.")]
    assert errors("1: x\n") == [("#", 1, "The mapping key 1 is not a string; quote it: '1'.")]
    assert errors("a: 1\n---\nb: 2\n") == [
        ("#", 2, "A workflow is one YAML document; remove the second one (after '---').")
    ]


def test_python_tags_construct_nothing(tmp_path) -> None:
    # An untrusted document: no Python object is ever built from a tag.
    marker = tmp_path / "pwned"
    result = check(f"steps: !!python/object/apply:os.system ['touch {marker}']\n")
    assert not marker.exists()
    assert [(p.pointer, p.detail) for p in result.problems] == [
        ("#/steps/0", "steps[0] must be a mapping, not a string.")
    ]


def test_a_billion_laughs_is_refused_quickly() -> None:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{','.join(f'*a{i - 1}' for _ in range(9))}]" for i in range(1, 10)]
    started = time.monotonic()
    result = validate("\n".join(lines) + "\n")
    assert time.monotonic() - started < 5
    assert [p.detail for p in result.problems] == [
        "The document expands to too much data (aliases repeat it too often)."
    ]


def test_deep_nesting_is_refused() -> None:
    result = validate("a: " + "[" * 10_000 + "]" * 10_000 + "\n")
    assert [p.detail for p in result.problems] == ["The document nests deeper than 64 levels."]
    deep_expression = (
        "steps:\n- name: s\n  image: alpine\n  spec: {x: '${" + "(" * 5000 + "1" + ")" * 5000 + "}'}\n"
    )
    assert "nests" in validate(deep_expression).problems[0].detail


def test_an_oversized_document_is_refused() -> None:
    result = validate("a: '" + "x" * MAX_BYTES + "'\n")
    assert [p.detail for p in result.problems] == [f"The document is over {MAX_BYTES} bytes."]


def test_parse_gives_frozen_steps() -> None:
    workflow = parse("steps:\n- name: s\n  image: alpine\n  spec: {a: 1}\n")
    step = workflow.steps[0]
    with pytest.raises(AttributeError):
        step.name = "other"  # type: ignore[misc]
    assert step.container is not None
    with pytest.raises(TypeError):
        step.container.spec["a"] = 2  # type: ignore[index]


# Documents the schema refuses, each in its own way (with relay-core's fixtures and the
# published workflows, which it takes).
SCHEMA_CASES = [
    "apiVersion: v1\nsteps: {}\n",
    "apiVersion: v2\nsteps: []\n",
    "steps:\n- image: alpine\n",
    "steps:\n- name: s\n  image: alpine\n  dependsOn: 5\n",
    "steps:\n- name: s\n  image: alpine\n  spec: [1]\n",
    "steps:\n- name: ''\n  image: alpine\n",
    "homepage: not a url\nsteps: []\n",
    "homepage: https://example.com/\nsource: 'c:\\\\x'\nsteps: []\n",
    "homepage: https://example.com/\nsteps: []\n",
    "parameters: [a]\nsteps: []\n",
    "triggers:\n- name: t\n  source: {type: push}\nsteps: []\n",
    "triggers:\n- name: t\n  source: {type: schedule, schedule: 5}\nsteps: []\n",
    "steps:\n- name: s\n  type: approval\n  image: alpine\n",
    "steps:\n- name: s\n  image: alpine\n  when: [1, true, null, 1.5, {a: b}]\n",
    'steps:\n- name: s\n  image: alpine\n  env: {A: ["\\\\udc00"]}\n',
]


@pytest.mark.parametrize(
    "text",
    [*SCHEMA_CASES, *(p.read_text() for p in sorted(FIXTURES.rglob("*.yaml")))],
)
def test_the_fast_schema_check_agrees_with_jsonschema(text: str) -> None:
    """jsonschema-rs answers whether a document passes; only a refused one is walked by
    jsonschema for the errors' wording, so they must agree on every document."""
    try:
        raw = load(text).raw
    except Exception:  # a fixture YAML cannot read: nothing reaches the schema
        return
    refused = bool(list(VALIDATOR.iter_errors(raw)))
    try:
        passes = FAST_VALIDATOR.is_valid(raw)
    except ValueError:  # what Rust cannot hold (a lone surrogate): jsonschema judges it alone
        passes = False
    assert passes is not refused
    if not refused:
        assert schema_problems(load(text)) == []
