"""Images other than `relaysh/core`, in a container runtime (STEP_CONTAINER_RUNTIME: `podman`
or `docker`): the same program (its `input` at relay-core's path, or `command`/`args`), the
same environment (METADATA_API_URL, CI, RELAY, its `env`), the same log, masking and limits.

UNTESTED here beyond the command line and the runtime's own failure (this machine has the
docker CLI and no engine; docs/script-steps.md "Script steps" says exactly what): a runtime that runs is
expected to behave as `podman run`/`docker run` document.

- no network (`--network=none`, only the container's own loopback): the host's network
  holds PostgreSQL, Redis and Vault on loopback. The sandbox's doors instead, as Unix
  sockets (network.StepNetwork, its directory bind-mounted read-only at /run/relay, mode 0700:
  for the container's root): runtime.sock (the runtime API, STEP_RUNTIME_URL's paths checked)
  and with STEP_NETWORK proxy.sock (the egress proxy). METADATA_API_URL is the sandbox's
  (http://…@127.0.0.1:8000): an image that wants it listens there and forwards to
  runtime.sock itself (as the sandbox's network.WRAPPER does with socat); an image that does
  not reaches nothing at all;
- the document's text never reads as an option: every option is written `--name=value` (its
  value cannot become an option), the image is an image reference (imageref: it cannot start
  with `-`), and it and the step's args come after `--`, which ends the options;
- limits: `--memory`/`--memory-swap` (STEP_MEMORY_BYTES), `--pids-limit`
  (STEP_MAX_PROCESSES), `--ulimit cpu` (STEP_CPU_SECONDS, per process); wall time and output
  size as for sandboxes (the supervisor kills the container by name, `<runtime> kill`);
- no capabilities, no new privileges;
- values of the environment are never on the command line (where `ps` shows them):
  `--env=NAME` takes each from the runtime client's own environment.
"""

import os
import re
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from django.conf import settings

from scriptsteps import network, sandbox
from workflows.dialect import imageref
from workflows.steps.base import StepContext, image_name

CORE = "relaysh/core"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Writer(Protocol):
    def feed(self, chunk: bytes) -> None: ...

    def tick(self) -> str | None: ...


def runtime_for(image: str) -> str | None:
    """The runtime that runs `image`: None for relaysh/core (the sandbox runs it)."""
    if image_name(image) == CORE:
        return None
    return settings.STEP_CONTAINER_RUNTIME or None


def command(
    runtime: str,
    ctx: StepContext,
    program: sandbox.Program,
    limits: sandbox.Limits,
    name: str,
    script_path: str | None,
    doors: Path | None = None,
) -> list[str]:
    problem = imageref.problem_with(ctx.image)
    if problem:  # validation refuses it; a revision saved before it did is refused here
        raise ValueError(problem)
    args = [
        runtime,
        "run",
        "--rm",
        f"--name={name}",
        "--pull=missing",
        "--network=none",
        f"--memory={limits.memory_bytes}b",
        f"--memory-swap={limits.memory_bytes}b",
        f"--pids-limit={limits.processes}",
        f"--ulimit=cpu={limits.cpu_seconds}:{limits.cpu_seconds}",
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
    ]
    if doors is not None:
        args.append(f"--volume={doors}:{network.INSIDE_DIR}:ro")
    args += [f"--env={variable}" for variable in sorted(program.env) if ENV_NAME.fullmatch(variable)]
    if script_path is not None:
        args += [f"--volume={script_path}:{sandbox.SCRIPT_PATH}:ro", f"--entrypoint={sandbox.SCRIPT_PATH}"]
        return [*args, "--", ctx.image]
    if ctx.command:
        args.append(f"--entrypoint={ctx.command}")
    return [*args, "--", ctx.image, *ctx.args]  # without a command: the image's own entrypoint


def run(runtime: str, ctx: StepContext, program: sandbox.Program, writer: Writer) -> sandbox.Result:
    limits = sandbox.Limits.from_settings()
    name = f"relay-step-{uuid.uuid4().hex[:16]}"
    script_path = None
    if program.script is not None:
        root = os.path.join(settings.STEP_CONTAINER_SCRIPTS, "")
        os.makedirs(root, mode=0o700, exist_ok=True)
        script_path = os.path.join(root, f"{name}.sh")
        fd = os.open(script_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o755)
        with os.fdopen(fd, "w") as file:
            file.write(program.script)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **program.env}
    for variable in ("HOME", "DOCKER_HOST", "CONTAINER_HOST", "XDG_RUNTIME_DIR"):
        if variable in os.environ:
            env.setdefault(variable, os.environ[variable])
    try:
        with network.StepNetwork(program.network) as doors:
            return sandbox.run_command(
                command(runtime, ctx, program, limits, name, script_path, doors.directory),
                env,
                limits,
                writer.feed,
                tick=writer.tick,
                kill_hook=_killer(runtime, name),
            )
    finally:
        _quietly([runtime, "rm", "-f", name])
        if script_path is not None:
            os.unlink(script_path)


def _killer(runtime: str, name: str) -> Callable[[], None]:
    # Killing the client does not stop the container: the runtime is told to.
    return lambda: _quietly([runtime, "kill", name])


def _quietly(argv: list[str]) -> None:
    try:
        subprocess.run(argv, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        pass
