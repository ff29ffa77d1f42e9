"""Images other than `relaysh/core`, in a container runtime (STEP_CONTAINER_RUNTIME: `podman`
or `docker`): the same program (its `input` at relay-core's path, or `command`/`args`), the
same environment (METADATA_API_URL, CI, RELAY, its `env`), the same log, masking and limits.

UNTESTED here beyond the command line and the runtime's own failure (this machine has the
docker CLI and no engine; README "Script steps" says exactly what): a runtime that runs is
expected to behave as `podman run`/`docker run` document.

- `--network host` (the runtime API is on the service's loopback address), `--network none`
  when STEP_NETWORK is off;
- limits: `--memory`/`--memory-swap` (STEP_MEMORY_BYTES), `--pids-limit`
  (STEP_MAX_PROCESSES), `--ulimit cpu` (STEP_CPU_SECONDS, per process); wall time and output
  size as for sandboxes (the supervisor kills the container by name, `<runtime> kill`);
- no capabilities, no new privileges;
- values of the environment are never on the command line (where `ps` shows them): `-e NAME`
  takes each from the runtime client's own environment.
"""

import os
import subprocess
import uuid
from collections.abc import Callable
from typing import Protocol

from django.conf import settings

from scriptsteps import sandbox
from workflows.steps.base import StepContext, image_name

CORE = "relaysh/core"


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
) -> list[str]:
    args = [
        runtime,
        "run",
        "--rm",
        "--name",
        name,
        "--pull",
        "missing",
        "--network",
        "host" if program.network else "none",
        "--memory",
        f"{limits.memory_bytes}b",
        "--memory-swap",
        f"{limits.memory_bytes}b",
        "--pids-limit",
        str(limits.processes),
        "--ulimit",
        f"cpu={limits.cpu_seconds}:{limits.cpu_seconds}",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
    ]
    for variable in sorted(program.env):
        args += ["-e", variable]
    if script_path is not None:
        args += [
            "-v",
            f"{script_path}:{sandbox.SCRIPT_PATH}:ro",
            "--entrypoint",
            sandbox.SCRIPT_PATH,
            ctx.image,
        ]
    elif ctx.command:
        args += ["--entrypoint", ctx.command, ctx.image, *ctx.args]
    else:
        args += [ctx.image, *ctx.args]  # the image's own entrypoint
    return args


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
        return sandbox.run_command(
            command(runtime, ctx, program, limits, name, script_path),
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
