"""relay-core's verdicts on its own fixture documents (pkg/workflow/types/v1/validate_test.go
and decoder_test.go), and the published workflows (every one in puppetlabs/relay-workflows),
which must be valid."""

from pathlib import Path

import pytest

from workflows.dialect.validate import parse, validate

FIXTURES = Path(__file__).parent / "fixtures"
RELAY_CORE = sorted((FIXTURES / "relay-core").rglob("*.yaml"))
PUBLISHED = sorted((FIXTURES / "relay-workflows").glob("*.yaml"))
EVERY_PUBLISHED = sorted((FIXTURES / "relay-workflows" / "published").glob("*.yaml"))

# The warnings published workflows get (pointer, start of the detail): both are things
# relay-core accepts, and the validator says what they do here.
PUBLISHED_WARNINGS = {
    # Binds eventDate, which it does not declare: relay-core would add it to the run's
    # parameters; no step reads it, so nothing changes when it is left out.
    "datadog-to-slack.yaml": [
        (
            "#/triggers/0/binding/parameters/eventDate",
            "The binding sets 'eventDate', which is not a parameter",
        ),
    ],
    # `git: !Fn.merge {connection: …, name: …, repository: …, branch: …}`: a plain map is a
    # keyword call, and merge's keyword form needs `objects` (relay-core's fnlib/merge.go), so
    # relay-core leaves the invocation unresolved too; the step cannot run as published.
    "terraform-continuous-deployment.yaml": [
        ("#/steps/0/spec/git", 'merge() cannot be called like this: fn: arg "objects": fn: arg not found'),
    ],
}


def relay_core_rejects(path: Path) -> bool:
    # relay-core's naming: *_invalid.yaml, and triggers_with_invalid_*.yaml.
    return path.stem.endswith("_invalid") or "_invalid_" in path.stem


def test_all_of_relay_cores_fixtures_are_here() -> None:
    assert len(RELAY_CORE) == 27
    assert sum(relay_core_rejects(p) for p in RELAY_CORE) == 9


@pytest.mark.parametrize("path", RELAY_CORE, ids=lambda p: str(p.relative_to(FIXTURES / "relay-core")))
def test_relay_core_fixture_verdicts(path: Path) -> None:
    result = validate(path.read_text())
    assert result.valid is not relay_core_rejects(path), result.problems


@pytest.mark.parametrize("path", PUBLISHED, ids=lambda p: p.name)
def test_published_puppet_workflows_are_valid(path: Path) -> None:
    result = validate(path.read_text())
    assert result.valid, result.problems
    assert result.warnings == []


def test_every_workflow_of_the_repository_is_here() -> None:
    # 44 directories with a workflow at 5d01fbac1fe4 (docs/workflows.md lists them); the three Puppet
    # ones are the same text as the pinned ones above, but for selective enforcement's tag.
    assert len(EVERY_PUBLISHED) == 44
    pinned = {p.name: p.read_bytes() for p in PUBLISHED}
    assert {p.name for p in EVERY_PUBLISHED} >= set(pinned)
    assert [p.name for p in EVERY_PUBLISHED if p.name in pinned and p.read_bytes() != pinned[p.name]] == [
        "puppet-selective-enforcement.yaml"
    ]


@pytest.mark.parametrize("path", EVERY_PUBLISHED, ids=lambda p: p.name)
def test_every_published_workflow_is_valid(path: Path) -> None:
    result = validate(path.read_text())
    assert result.valid, [(p.pointer, p.line, p.detail) for p in result.problems]
    assert result.workflow is not None
    expected = PUBLISHED_WARNINGS.get(path.name, [])
    assert [w.pointer for w in result.warnings] == [pointer for pointer, _ in expected]
    for warning, (_, detail) in zip(result.warnings, expected, strict=True):
        assert warning.detail.startswith(detail), warning.detail


@pytest.mark.parametrize(
    ("name", "errors"),
    [
        (
            "triggers_with_invalid_binding.yaml",
            [("#/triggers/0/binding", "triggers[0].binding must be a mapping, not a list.")],
        ),
        (
            "triggers_with_invalid_source.yaml",
            [
                ("#/triggers/0/source", "'schedule' is required here."),
                ("#/triggers/1/source", "A container step (or webhook trigger) needs an 'image'."),
            ],
        ),
        (
            "triggers_with_invalid_source_type.yaml",
            [
                (
                    "#/triggers/0/source",
                    "A trigger's source type is 'push', 'schedule' or 'webhook', not 'scheduled'.",
                ),
                (
                    "#/triggers/1/source",
                    "A trigger's source type is 'push', 'schedule' or 'webhook', not 'pushed'.",
                ),
                (
                    "#/triggers/2/source",
                    "A trigger's source type is 'push', 'schedule' or 'webhook', not 'webhooked'.",
                ),
            ],
        ),
    ],
)
def test_trigger_errors_name_the_same_fields_as_relay_core(name: str, errors: list[tuple[str, str]]) -> None:
    # relay-core: (root).triggers.0.binding "Invalid type. Expected: object, given: array";
    # triggers.0.source "schedule is required", triggers.1.source "image is required";
    # triggers.N.source.type does not match the three constants.
    result = validate((FIXTURES / "relay-core" / "triggers" / name).read_text())
    assert [(p.pointer, p.detail) for p in result.problems] == errors


def test_decoding_valid_workflow() -> None:
    # decoder_test.go's validWorkflow, with the step's env and spec of the pinned fixture.
    workflow = parse(
        "apiVersion: v1\ndescription: This is a workflow\nparameters:\n  hi:\n    default: 5\n"
        '    description: "Hello"\nsteps:\n  - name: step-1\n    image: image-1\n'
        "    env:\n      CI: true\n      RETRIES: 3\n    spec:\n      tag: v1\n"
    )
    assert workflow.api_version == "v1" and workflow.description == "This is a workflow"
    (hi,) = workflow.parameters.values()
    assert (hi.name, hi.description, hi.has_default, hi.default) == ("hi", "Hello", True, 5)
    (step,) = workflow.steps
    assert step.name == "step-1" and step.kind == "container" and step.container is not None
    assert step.container.image == "image-1"
    assert dict(step.container.spec) == {"tag": "v1"}
    assert dict(step.container.env) == {"CI": True, "RETRIES": 3}


def test_decoding_complicated_workflow() -> None:
    workflow = parse((FIXTURES / "relay-core" / "complicated.yaml").read_text())
    assert workflow.description == "a more complicated workflow"
    assert {n: p.default for n, p in workflow.parameters.items()} == {
        "param-1": "param-1-default",
        "param-2": "param-2-default",
    }
    assert [(s.name, s.kind) for s in workflow.steps] == [
        ("step-1", "container"),
        ("step-2", "container"),
        ("approval-1", "approval"),
    ]
    step2 = workflow.steps[1]
    assert step2.container is not None and step2.container.image == "relaysh/core:latest"
    assert len(step2.container.spec) == 5
    # The output reference makes step-2 wait for step-1, without a dependsOn.
    assert step2.implicit_depends_on == ("step-1",) and step2.needs == ("step-1",)


@pytest.mark.parametrize(
    ("parameter", "has_default", "default"),
    [
        ("{description: test, default: hello}", True, "hello"),
        ("{description: test}", False, None),
        ("{description: test, default: null}", True, None),
    ],
    ids=["default string", "no default", "default null literal"],
)
def test_a_null_default_is_a_default(parameter: str, has_default: bool, default: object) -> None:
    # types_test.go: a parameter whose default is null has a default.
    workflow = parse(f"apiVersion: v1\nparameters:\n  p: {parameter}\nsteps: []\n")
    assert (workflow.parameters["p"].has_default, workflow.parameters["p"].default) == (has_default, default)
