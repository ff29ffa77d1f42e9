"""Script steps: what the handler (handler.py) and the `steps` queue's task (tasks.py) do.

- `queue(step_run_id)` (the handler's start, inside the engine's transaction): the step's
  ScriptRun, and the task that runs it, sent after the commit;
- `execute(step_run_id)` (the task, on a worker of the `steps` queue): evaluates the step
  again there (its secrets are read from Vault by the worker that uses them, never sent
  through the broker), grants its runtime credential, runs the sandbox with the log stored as
  it comes, records how it ended, and wakes the step;
- `follow(script)` (the handler's check): the step's outcome once the script ended; a script
  whose worker died is `lost` after STEP_LOST_AFTER seconds and a queued one that no worker
  takes is sent again and then failed, so no step waits forever.
"""

import codecs
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, TypeVar

from django.conf import settings
from django.db import OperationalError, transaction
from django.utils import timezone

from relay import dispatch
from scriptsteps import container, network, sandbox
from scriptsteps.masking import Masker, strings_in
from scriptsteps.models import ScriptRun, ScriptStatus
from stepruntime.credentials import grant
from workflows import engine
from workflows.dialect import imageref
from workflows.models import StepRun
from workflows.steps.base import Done, StepContext, Wait, image_name

log = logging.getLogger(__name__)

CORE = "relaysh/core"
WAKE = "script"
MAX_REQUEUES = 2
ADMIN_TAIL = 20000  # characters of a log the admin's run page starts with
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
T = TypeVar("T")


# The program a step runs ------------------------------------------------------------------


def is_python(image: str) -> bool:
    """`relaysh/core:latest-python` (any tag naming python) has relay_sdk; `relaysh/core`
    (any other tag) has bash, jq, curl and ni."""
    name = image.split("@", 1)[0]
    tag = name.rsplit("/", 1)[-1].partition(":")[2]
    return "python" in tag


def script_for_input(lines: tuple[str, ...]) -> str:
    """relay-core's ScriptForInput: the lines joined, run by /bin/sh unless they start with
    their own `#!`."""
    script = "\n".join(lines)
    return script if script.startswith("#!") else "#!/bin/sh\n" + script


def problem_with(ctx: StepContext, needs_program: bool = True) -> str:
    """Why the step cannot run at all ("" when it can), said before anything is queued.
    relaysh/core `needs_program`; another image may run its own entrypoint."""
    if needs_program and not ctx.input and not ctx.command:
        return (
            f"Step {ctx.step_name!r} has nothing to run: give `input` (shell lines) or `command` "
            f"(with `args`) for {image_name(ctx.image)}."
        )
    image = imageref.problem_with(ctx.image)
    if image:  # validation refuses it; a revision saved before it did is refused here
        return f"image: {image}"
    bad = [name for name in ctx.env if not ENV_NAME.match(str(name))]
    if bad:
        return f"env.{bad[0]}: not a name an environment variable can have (letters, digits and _)."
    return ""


def _env_value(value: Any) -> str:
    # relay-core puts env values into the container as strings; others as their JSON.
    text = value if isinstance(value, str) else json.dumps(value)
    return text.replace("\x00", "")


def program_of(ctx: StepContext, url: str) -> sandbox.Program:
    env = {str(name): _env_value(value) for name, value in ctx.env.items()}
    env.update({"CI": "true", "RELAY": "true", "METADATA_API_URL": url})
    if ctx.input:
        return sandbox.Program(
            argv=[sandbox.SCRIPT_PATH],
            env=env,
            script=script_for_input(ctx.input),
            python=is_python(ctx.image),
            network=settings.STEP_NETWORK,
        )
    return sandbox.Program(
        argv=[ctx.command, *ctx.args], env=env, python=is_python(ctx.image), network=settings.STEP_NETWORK
    )


# The handler's side -----------------------------------------------------------------------


def queue(step_run_id: str) -> ScriptRun:
    """The step's script, queued on the `steps` queue once the caller's transaction commits."""
    script, _ = ScriptRun.objects.get_or_create(step_run_id=step_run_id)
    _send(step_run_id)
    return script


def _send(step_run_id: str) -> None:
    def send() -> None:
        try:
            dispatch.publish("scriptsteps.tasks.run_script", str(step_run_id))
        except Exception:
            # The step's check sends it again at its recheck time (follow()).
            log.warning("could not queue script of step %s", step_run_id, exc_info=True)

    transaction.on_commit(send)


def follow(script: ScriptRun) -> Done | Wait:
    """What the step is now: ended with its script, or waiting for it (woken when it ends)."""
    if script.status == ScriptStatus.QUEUED:
        waited = (timezone.now() - script.queued_at).total_seconds()
        if waited >= settings.STEP_QUEUE_TIMEOUT:
            if script.requeue(MAX_REQUEUES):
                _send(str(script.pk))
            else:
                script.fail_to_start(
                    f"No worker took the script within {settings.STEP_QUEUE_TIMEOUT} seconds, "
                    f"{MAX_REQUEUES + 1} times: is a worker consuming the `steps` queue?"
                )
        return _waiting(script)
    if script.status == ScriptStatus.RUNNING and script.lose(settings.STEP_LOST_AFTER):
        log.warning("script of step %s lost: %s", script.pk, script.reason)
    if not script.ended:
        return _waiting(script)
    if script.success:
        return Done(True)
    if script.system_error:
        return Done(False, message=script.reason, system_error=True)
    if script.reason:
        return Done(False, message=script.reason)
    return Done(False, message=f"The script exited with status {script.exit_code}.")


def _waiting(script: ScriptRun) -> Done | Wait:
    script.refresh_from_db()
    if script.ended:
        return follow(script)
    if script.status == ScriptStatus.QUEUED:
        recheck = script.queued_at + timedelta(seconds=settings.STEP_QUEUE_TIMEOUT)
    else:
        recheck = (script.heartbeat_at or timezone.now()) + timedelta(seconds=settings.STEP_LOST_AFTER + 1)
    return Wait(recheck_at=recheck, state={"script": str(script.pk)}, wake_on=(WAKE, str(script.pk)))


def cancel(step_run_id: str) -> None:
    script = ScriptRun.objects.filter(pk=step_run_id).first()
    if script is not None:
        script.request_cancel()


# The worker's side ------------------------------------------------------------------------


def execute(step_run_id: str) -> None:
    """Run the step's script (at most once), then wake the step."""
    script = ScriptRun.objects.filter(pk=step_run_id).first()
    if script is None:
        return
    worker = script.claim()
    if worker is None:
        return  # another message got it, or it was cancelled while queued
    # The step looks again now that it runs: its next check is due when a dead worker would
    # be noticed (STEP_LOST_AFTER), not when a queued script would be given up on.
    engine.wake(WAKE, str(step_run_id))
    try:
        _execute(script, worker)
    finally:
        written(lambda: engine.wake(WAKE, str(step_run_id)), f"the wake of step {step_run_id}")


def written(write: Callable[[], T], what: str) -> T:
    """`write`, tried again while the database is busy (`make run`'s SQLite, whose one writer
    at a time may keep another waiting past its timeout in a burst) for up to STEP_LOST_AFTER
    seconds: what a script did is not lost to a moment's contention."""
    deadline = time.monotonic() + settings.STEP_LOST_AFTER
    while True:
        try:
            return write()
        except OperationalError:
            if time.monotonic() >= deadline:
                raise
            log.info("%s waited for the database; trying again", what)
            time.sleep(0.25)


def _execute(script: ScriptRun, worker: uuid.UUID) -> None:
    try:
        ctx = engine.context_of(str(script.pk))
    except engine.ContextError as exc:
        script.fail_to_start(str(exc))
        return
    except Exception as exc:
        log.warning("script of step %s could not be prepared", script.pk, exc_info=True)
        script.fail_to_start(f"The step could not be prepared ({type(exc).__name__}: {exc}).")
        return
    runtime = container.runtime_for(ctx.image)
    # A sandbox (or a container) reaches the runtime API through its own door: its network
    # is its own.
    url = grant(str(script.pk), network.runtime_url_inside())
    writer = LogWriter(script, worker, [*ctx.secrets, *_credentials_in(url)], run_id=ctx.run_id)
    try:
        if runtime is not None:
            result = container.run(runtime, ctx, program_of(ctx, url), writer)
        else:
            result = sandbox.run(
                program_of(ctx, url), sandbox.Limits.from_settings(), writer.feed, tick=writer.tick
            )
    except sandbox.SandboxUnavailable as exc:
        writer.close()
        script.fail_to_start(str(exc), system_error=True)
        return
    except Exception as exc:
        # Not the script's doing (the machine, a bug): said as such, at once, rather than
        # left for STEP_LOST_AFTER to find.
        log.exception("script of step %s: the sandbox failed", script.pk)
        writer.close()
        script.finish(worker, None, f"The sandbox failed ({type(exc).__name__}: {exc}).", None, True)
        return
    writer.close()
    first = result.first_output_at
    first_ms = (first - result.spawned_at) * 1000 if first is not None else None
    reason = writer.stopped or result.reason
    system_error = result.system_error and not writer.stopped
    if not written(
        lambda: script.finish(worker, result.exit_code, reason, first_ms, system_error),
        f"the end of {script}",
    ):
        log.info("script of step %s ended after it was declared lost", script.pk)
    log.info(
        "script of step %s exited %s in %.2fs%s",
        script.pk,
        result.exit_code,
        result.ended_at - result.spawned_at,
        f": {result.reason}" if result.reason else "",
    )


def _credentials_in(url: str) -> list[str]:
    """The step's runtime credential (METADATA_API_URL's user part): masked like a secret."""
    user, at, _ = url.partition("://")[2].partition("@")
    return [part for part in user.split(":") if part] if at else []


class LogWriter:
    """The step's output as the sandbox gives it: decoded (UTF-8, broken bytes replaced),
    masked, and stored every tick; with the heartbeat that says its worker lives.

    Besides the secrets it was given, the step can read every sensitive output of its run
    (GET /outputs/{step}/{name}), also one that a step running beside it sets after it
    started: before each store the writer reads the run's sensitive outputs as they are now
    (StepRun.sensitive_values), so a value the step could read before it printed it is
    masked in what is stored."""

    def __init__(self, script: ScriptRun, worker: uuid.UUID, secrets: list[str], run_id: str = "") -> None:
        self.script = script
        self.worker = worker
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.masker = Masker(secrets)
        self.run_id = run_id
        self.seen: dict[Any, Any] = {}  # StepRun.sensitive_values' memory
        self.pending: list[str] = []
        self.unstored = ""  # masked, not yet stored: the database was busy
        self.flushed = False
        self.last_beat = time.monotonic()
        self.stopped = ""

    def feed(self, chunk: bytes) -> None:
        text = self.decoder.decode(chunk)
        if text:
            # PostgreSQL text cannot hold NUL.
            self.pending.append(text.replace("\x00", "\ufffd"))

    def tick(self) -> str | None:
        self._store()
        if time.monotonic() - self.last_beat >= settings.STEP_HEARTBEAT:
            try:
                ours = self.script.heartbeat(self.worker)
            except OperationalError:
                # The database is busy: the next tick (a quarter of a second) beats again,
                # long before STEP_LOST_AFTER.
                log.info("the heartbeat of %s waited for the database; trying again", self.script)
                return None
            self.last_beat = time.monotonic()
            if not ours:
                self.script.refresh_from_db(fields=["status", "cancel_requested"])
                self.stopped = (
                    "Cancelled with the run."
                    if self.script.cancel_requested
                    else "The script was declared lost (its worker was not heard of in time)."
                )
                return self.stopped
        return None

    def close(self) -> None:
        self.pending.append(self.decoder.decode(b"", final=True))
        written(lambda: self._store(final=True), f"the log of {self.script}")

    def _store(self, final: bool = False) -> None:
        """The output so far, masked, appended to the stored log. While the database is busy
        it waits here, masked, for the next tick (nothing of it is lost or masked twice);
        with `final`, the caller tries again."""
        try:
            self._mask(final)
            if self.unstored:
                self.script.append_log(self.unstored)
                self.unstored = ""
        except OperationalError:
            if final:
                raise
            log.info("the log of %s waited for the database; stored at the next tick", self.script)

    def _mask(self, final: bool) -> None:
        text = "".join(self.pending)
        if text and self.run_id:
            sensitive = StepRun.sensitive_values(self.run_id, self.seen)
            self.masker.add(s for value in sensitive for s in strings_in(value))
        self.pending = []
        text = self.masker.feed(text)
        if final and not self.flushed:
            text += self.masker.flush()
            self.flushed = True
        self.unstored += text


def read_log(step: StepRun, offset: int, limit: int) -> Mapping[str, Any]:
    """A step's log from `offset` (characters) for the API and the admin: the text, where the
    next read starts, and whether more can come."""
    script = ScriptRun.objects.filter(pk=step.pk).first()
    text = script.read_log(offset, limit) if script is not None else ""
    length = script.log_length if script is not None else 0
    ended = step.resolved and (script is None or script.ended or script.status == ScriptStatus.QUEUED)
    return {
        "step": step.name,
        "status": step.status,
        "offset": offset,
        "next_offset": offset + len(text),
        "length": length,
        "text": text,
        "complete": bool(ended and offset + len(text) >= length),
    }
