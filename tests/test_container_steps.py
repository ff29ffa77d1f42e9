"""Container steps (scriptsteps/container.py) cannot reach the host: `image` is an image
reference (the OCI distribution grammar) on validate and save, the runtime's command line
never takes a document's text as an option, and the container has no network.

No container engine runs on this machine (the docker CLI is installed, its daemon is not):
what is checked is the exact argv the service hands the runtime, and the validation through
the API."""

from datetime import UTC, datetime
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from scriptsteps import container, network, sandbox, services
from workflows.dialect import imageref
from workflows.steps.base import StepContext

GOOD = [
    "alpine",
    "alpine:3",
    "relaysh/core:latest-python",
    "docker.io/library/debian:12",
    "localhost:5000/team/tool:1.2",
    "[::1]:5000/tool",
    "Registry.Example.com/team_a/tool__x-y.z:V1_2-rc.3",
    "registry.example.com/tool@sha256:" + "a" * 64,
    "tool:1@sha512:" + "0" * 128,
    "a" * 255,
]
BAD = [
    "--privileged",
    "-v",
    "alpine --privileged",
    "alpine:3 -v /:/host",
    "Alpine",  # a path component is lowercase
    "alpine:",
    "alpine:-x",
    "alpine::3",
    "/alpine",
    "alpine/",
    "alpine:3\n",
    "alpine@sha256:abc",
    "alpine@sha256:" + "a" * 63,
    "alpine:" + "x" * 129,
    "a" * 256,
    "a/" * 127 + "ab",  # a name over 255 characters
    "alpine\x00",
    "${parameters.image}",
]


@pytest.mark.parametrize("image", GOOD)
def test_image_references_of_the_distribution_grammar_are_taken(image):
    assert imageref.problem_with(image) == ""


@pytest.mark.parametrize("image", BAD)
def test_what_is_not_an_image_reference_is_refused(image):
    assert imageref.problem_with(image)


def document(image: str, where: str = "step") -> str:
    if where == "step":
        return (
            f'apiVersion: v1\nsteps:\n- name: s\n  image: "{image}"\n  args: [-v, /:/host, --network, host]\n'
        )
    return (
        "apiVersion: v1\nsteps:\n- {name: s, image: alpine, input: [echo hi]}\n"
        f'triggers:\n- name: hook\n  source:\n    type: webhook\n    image: "{image}"\n'
    )


@pytest.mark.parametrize("image", ["--privileged", "alpine -v", "Alpine:3", "alpine@sha256:00"])
@pytest.mark.parametrize(
    ("where", "pointer"), [("step", "#/steps/0/image"), ("trigger", "#/triggers/0/source/image")]
)
def test_validate_answers_400_at_the_image(alice_api: APIClient, image, where, pointer):
    response = alice_api.post(
        "/api/workflows/validate", data=document(image, where), content_type="application/yaml"
    )
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["type"] == "urn:relay:problem:invalid_workflow"
    assert [error["pointer"] for error in body["errors"]] == [pointer]
    assert "is not an image reference" in body["errors"][0]["detail"]


def test_saving_refuses_a_bad_image_and_keeps_what_was_there(alice_api: APIClient):
    good = document("debian:12")
    created = alice_api.post("/api/workflows/", {"name": "c", "source": good}, format="json")
    assert created.status_code == 201, created.content
    bad = alice_api.post("/api/workflows/", {"name": "d", "source": document("--privileged")}, format="json")
    assert bad.status_code == 400
    assert [error["pointer"] for error in bad.json()["errors"]] == ["#/steps/0/image"]
    changed = alice_api.put("/api/workflows/c/", {"source": document("--privileged")}, format="json")
    assert changed.status_code == 400
    assert [error["pointer"] for error in changed.json()["errors"]] == ["#/steps/0/image"]
    assert alice_api.get("/api/workflows/c/").json()["source"] == good


def context(image: str = "debian:12", **fields) -> StepContext:
    return StepContext(
        step_run_id="s",
        run_id="r",
        owner_id=1,
        step_name="s",
        image=image,
        spec={},
        env={},
        state={},
        started_at=datetime.now(UTC),
        **fields,
    )


LIMITS = sandbox.Limits(10, 5, 64 * 1024 * 1024, 32, 1000, 1000)


@pytest.mark.parametrize("runtime", ["docker", "podman"])
@pytest.mark.parametrize(
    "fields",
    [
        {"command": "--privileged", "args": ("-v", "/:/host", "--network=host")},
        {"command": "-v", "args": ("/:/host",)},
        {"args": ("--privileged", "-v", "/:/host")},
    ],
)
def test_the_documents_text_is_never_an_option_of_the_runtime(runtime, fields):
    program = sandbox.Program(argv=[], env={"CI": "true", "METADATA_API_URL": "http://x@h"}, network=True)
    argv = container.command(runtime, context(**fields), program, LIMITS, "relay-step-1", None)
    end = argv.index("--")
    options = argv[2:end]
    # Every option is one argument, --name=value: no value is a separate argument that a
    # runtime could read as an option of its own.
    assert all(option.startswith("--") and "=" in option for option in options if option != "--rm")
    assert argv[end + 1 :] == ["debian:12", *fields.get("args", ())]
    assert [o for o in options if o.startswith("--entrypoint")] == (
        [f"--entrypoint={fields['command']}"] if "command" in fields else []
    )
    # Nothing of the document's is an option of its own.
    assert not {"--privileged", "-v", "/:/host", "--network=host"} & set(options)
    # No host network, whatever STEP_NETWORK says: only the container's own loopback.
    assert [o for o in options if o.startswith("--network")] == ["--network=none"]


def test_a_script_in_a_container_has_no_network_but_the_sandboxs_doors():
    program = sandbox.Program(argv=[], env={}, script="#!/bin/sh\necho hi\n", network=True)
    doors = Path("/run/relay-step-mounts/net-abc")
    argv = container.command("docker", context(), program, LIMITS, "n", "/srv/s.sh", doors)
    assert "--network=none" in argv and not [a for a in argv if "host" in a]
    # The runtime API's and the proxy's Unix sockets, read-only where the sandbox has them.
    assert f"--volume={doors}:{network.INSIDE_DIR}:ro" in argv[: argv.index("--")]
    assert argv[-2:] == ["--", "debian:12"]


@pytest.mark.parametrize("image", ["--privileged", "debian:12 -v /:/host", "-"])
def test_an_image_saved_before_it_was_checked_never_reaches_the_command_line(image):
    program = sandbox.Program(argv=[], env={})
    with pytest.raises(ValueError, match="not an image reference"):
        container.command("docker", context(image), program, LIMITS, "n", None)
    # And the step fails at its start, before anything is queued.
    assert services.problem_with(context(image, command="/bin/true"), needs_program=False).startswith(
        "image: "
    )
