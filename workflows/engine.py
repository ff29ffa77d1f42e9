"""The workflow engine: what moves a run along. Celery tasks (workflows.tasks) call these
functions with ids, and the engine queues them by name (relay.dispatch), never importing
them; every bit of state is in the database, so any worker can pick up any run, a
duplicated message does nothing twice, and a lost one is sent again by the sweeper.

The engine runs any step kind its registry (workflows.steps.registry) holds, and imports
none: each kind registers itself from its app's AppConfig.ready().

A run's life:

- `create_run` binds the parameters (a missing one: a 400 for the API, or a run that fails
  before any step starts), makes the run and its steps (`pending`) and queues `start_run`;
- `advance` (after every step that ends) queues `start_step` for each pending step whose
  predecessors (dependsOn, output and !Status references) have all ended, and completes the
  run with its outcome when every step has;
- `start_step` decides the step: skipped when a step it needs did not end `success` or its
  `when` is false; otherwise it claims it (a compare-and-set, so one message wins) and calls
  its handler's start with the evaluated spec. An approval waits for its answer instead;
- a handler that returns Wait leaves the step in progress with no worker; `wake(kind, key)`
  or the step's recheck time brings it back (`resume_step`, which calls the handler's check);
- `sweep` (beat) re-queues what a lost message or a killed worker left behind.

RFC 0005's rules: `dependsOn` means "ended success"; a failed step fails the run unless a
condition on its status in a later step's `when` was true (that step lists it in
`excused`); a step in `system-error` stops the run, which ends `system-error`.
"""

import gc
import json
import logging
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from types import BuiltinFunctionType, CodeType, FunctionType, MethodType, ModuleType
from typing import Any, Literal
from urllib.parse import urlsplit

from django.conf import settings
from django.db import models, transaction
from django.db.models import Exists, Max, OuterRef
from django.utils import timezone

from relay import dispatch, rows
from scriptsteps.masking import Masker, strings_in  # a step's message masks what its log masks
from workflows.dialect import validate
from workflows.dialect.errors import EvaluationError
from workflows.dialect.evaluate import Data, evaluate
from workflows.dialect.model import Result, Unresolvable
from workflows.dialect.problems import DocumentError
from workflows.dialect.values import type_name, unstorable
from workflows.dialect.workflow import Step as StepSpec
from workflows.dialect.workflow import Workflow as ParsedWorkflow
from workflows.models import (
    RESOLVED,
    OverBudget,
    RunOutcome,
    RunStatus,
    StepKind,
    StepRun,
    StepStatus,
    Workflow,
    WorkflowRevision,
    WorkflowRun,
    WorkflowSecret,
    lock_owner,
)
from workflows.steps import registry
from workflows.steps.base import Done, Outcome, StepContext, Wait

log = logging.getLogger(__name__)

# The tasks that call the engine (workflows.tasks), by their Celery names: it queues them
# through relay.dispatch, never importing the module that imports it.
START_RUN = "workflows.tasks.start_run"
ADVANCE_RUN = "workflows.tasks.advance_run"
START_STEP = "workflows.tasks.start_step"
RESUME_STEP = "workflows.tasks.resume_step"


# Documents -----------------------------------------------------------------------------------


class ParsedCache:
    """Revisions' documents as the engine uses them, by revision id. Revisions never change,
    so each process parses each one once (a published workflow takes about 4 ms, 200 steps
    0.2 s) and keeps the ones used last, up to PARSED_CACHE_MAX_BYTES of them: a 1 MiB
    document's parse holds 1 MB (one long string) to 12 MB (many small nodes), a small
    one's 10 KB, so a count of entries bounds nothing. Each entry is weighed once, by
    walking what it holds (footprint: 2-5% of the parse's time); one heavier than the whole
    budget is parsed each time, never kept."""

    def __init__(self) -> None:
        self.entries: OrderedDict[int, tuple[ParsedWorkflow, int]] = OrderedDict()
        self.bytes = 0
        self.lock = threading.Lock()  # the web's threads share it

    def __call__(self, revision_id: int) -> ParsedWorkflow:
        with self.lock:
            kept = self.entries.get(revision_id)
            if kept is not None:
                self.entries.move_to_end(revision_id)
                return kept[0]
        source = WorkflowRevision.objects.values_list("source", flat=True).get(pk=revision_id)
        document = validate.parse(source, stored=True)
        size = footprint(document)
        budget = settings.PARSED_CACHE_MAX_BYTES
        with self.lock:
            if size <= budget and revision_id not in self.entries:
                self.entries[revision_id] = (document, size)
                self.bytes += size
                while self.bytes > budget:
                    _, (_, dropped) = self.entries.popitem(last=False)
                    self.bytes -= dropped
        return document

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()
            self.bytes = 0

    cache_clear = clear  # functools.lru_cache's name, which this replaced


_NOT_HELD = (type, ModuleType, FunctionType, BuiltinFunctionType, MethodType, CodeType)


def footprint(root: Any) -> int:
    """The bytes `root` and what it refers to take (sys.getsizeof of each object once;
    classes, modules and functions are shared, not held). About 0.8 to 1.0 of what
    tracemalloc counts for a parsed document (the allocator's own overhead is not seen)."""
    seen: set[int] = set()
    stack = [root]
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _NOT_HELD):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if not isinstance(obj, str | bytes | int | float):
            stack.extend(gc.get_referents(obj))
    return total


parsed = ParsedCache()


# Creating a run ------------------------------------------------------------------------------


class ParameterError(Exception):
    """Parameters a run cannot start with: required ones missing, ones the workflow does
    not declare, or values that cannot be kept (name → why: a number too large for a
    float64, which relay-core's Go could not read either)."""

    def __init__(self, missing: list[str], unknown: list[str], invalid: dict[str, str] | None = None) -> None:
        self.missing, self.unknown, self.invalid = missing, unknown, invalid or {}
        parts = []
        if missing:
            parts.append("missing required parameters: " + ", ".join(missing))
        if unknown:
            parts.append("parameters the workflow does not declare: " + ", ".join(unknown))
        parts += [f"parameter {name!r}: {why}" for name, why in self.invalid.items()]
        super().__init__("; ".join(parts).capitalize() + ".")


def bind_parameters(document: ParsedWorkflow, given: Mapping[str, Any]) -> dict[str, Any]:
    """The values a run starts with: those given, then the defaults. Raises ParameterError."""
    unknown = sorted(name for name in given if name not in document.parameters)
    bound: dict[str, Any] = {}
    missing = []
    invalid = {}
    for name, parameter in document.parameters.items():
        if name in given:
            bound[name] = given[name]
        elif parameter.has_default:
            bound[name] = parameter.default
        else:
            missing.append(name)
            continue
        why = unstorable(bound[name])
        if why is not None:
            invalid[name] = why
    if missing or unknown or invalid:
        raise ParameterError(missing, unknown, invalid)
    return bound


def create_run(
    workflow: Workflow,
    parameters: Mapping[str, Any],
    *,
    created_by: Any = None,
    event: Any = None,
    strict: bool = True,
    revision: WorkflowRevision | None = None,
    unbound: Mapping[str, str] | None = None,
    schedule: Any = None,
    scheduled_for: datetime | None = None,
    parent_step: StepRun | None = None,
) -> WorkflowRun:
    """Start a run of `revision`, by default the workflow's newest.

    With `strict` (the API, a step), parameters it cannot start with raise ParameterError,
    and an owner with RUN_MAX_IN_PROGRESS runs not complete raises OverBudget; nothing is
    made. Without (a trigger's event, a schedule), the run is made and fails at once, every
    step `skipped`, with the reason in its message: the event's run is on record. So does
    one with `unbound` parameters (name → why a trigger's binding gave it no value).

    A run a step starts (`parent_step`) is one deeper than the step's run; past
    RUN_MAX_DEPTH it raises OverBudget."""
    revision = revision or workflow.latest_revision()
    if revision is None:
        raise ValueError(f"workflow {workflow.pk} has no revision")
    document = parsed(revision.pk)
    problem = ""
    try:
        bound = bind_parameters(document, parameters)
    except ParameterError as exc:
        if strict:
            raise
        # The run is kept with what can be kept of them, and fails at once.
        bound, problem = {k: v for k, v in parameters.items() if k not in exc.invalid}, str(exc)
    if unbound:
        problem = " ".join(
            [problem, *(f"The trigger's binding of {name!r} failed: {why}." for name, why in unbound.items())]
        ).strip()
    depth = parent_step.run.depth + 1 if parent_step is not None else 0
    if depth > settings.RUN_MAX_DEPTH:
        raise OverBudget(
            f"A run started by a step may be at most {settings.RUN_MAX_DEPTH} runs deep "
            f"(RUN_MAX_DEPTH); this one would be {depth} deep.",
            size=False,
        )
    with transaction.atomic():
        busy = runs_in_progress(workflow.owner_id, lock=True)
        if busy >= settings.RUN_MAX_IN_PROGRESS:
            why = (
                f"its owner has the most runs in progress one owner may have, "
                f"{settings.RUN_MAX_IN_PROGRESS} (RUN_MAX_IN_PROGRESS); start it again when some have ended."
            )
            if strict:
                raise OverBudget(why[0].upper() + why[1:], size=False)
            problem = f"Not started: {why} {problem}".strip()
        run = WorkflowRun.objects.create(
            workflow=workflow,
            revision=revision,
            parameters=bound,
            event=event,
            schedule=schedule,
            scheduled_for=scheduled_for,
            created_by=created_by,
            parent_step=parent_step,
            depth=depth,
        )
        StepRun.objects.bulk_create(
            StepRun(
                run=run,
                index=index,
                name=step.name,
                kind=step.kind,
                image=step.container.image if step.container else "",
                status=StepStatus.SKIPPED if problem else StepStatus.PENDING,
            )
            for index, step in enumerate(document.steps)
        )
        if problem:
            run.finish(RunOutcome.FAILURE, problem)
        else:
            _queue(START_RUN, run.pk)
    log.info("workflow run %s of %s created", run.pk, workflow.pk)
    return run


def runs_in_progress(owner_id: Any, lock: bool = False) -> int:
    """How many of the owner's runs are not complete. With `lock` (in a transaction), the
    owner's row is locked first, so that runs made at once for one owner are counted one
    after the other and never pass RUN_MAX_IN_PROGRESS together."""
    if lock:
        lock_owner(owner_id)
    return WorkflowRun.objects.filter(
        workflow__owner_id=owner_id, status__in=[RunStatus.INITIALIZING, RunStatus.IN_PROGRESS]
    ).count()


def start_run(run_id: str) -> None:
    run = WorkflowRun.objects.filter(pk=run_id).first()
    if run is None:
        return
    run.begin()
    advance(run_id)


# Moving a run along --------------------------------------------------------------------------


def advance(run_id: Any, requeue: bool = False, inline: bool = False) -> str | None:
    """Queue every pending step whose predecessors have all ended, once (or again, with
    `requeue`: the sweeper's, for a message that was lost); complete the run when every step
    has. Idempotent: called after each step ends, and by the sweeper. Inside a transaction
    it is part of it (a step's outcome, its successors marked and their starts sent when it
    commits, one transaction); else it makes its own.

    With `inline`, when exactly one step becomes ready its start is not sent: its id is
    returned, for the caller to start it itself once this commits (see `follow`); its
    `queued_at` is set all the same, so a caller that dies before starting it leaves it to
    the sweeper, as a lost message would be."""
    with transaction.atomic(savepoint=False):
        return _advance(run_id, requeue, inline)


def _advance(run_id: Any, requeue: bool, inline: bool) -> str | None:
    # The run's row, locked until the transaction ends: two steps that end at once are
    # advanced one after the other, and the second reads (in a statement begun after the
    # lock was granted) what the first committed. So the last step's transaction always
    # sees every other step ended, the run completes exactly once, and no step is sent twice.
    locked = _locked_run.instances(run_id)
    if not locked or locked[0].status == RunStatus.COMPLETE:
        return None
    run = locked[0]
    if run.status == RunStatus.INITIALIZING and not run.cancel_requested:
        return None  # start_run begins it
    steps = sorted(_step_states.instances(run.pk), key=lambda step: step.index)
    if all(step.resolved for step in steps):
        outcome, message = _outcome(run, steps)
        if run.finish(outcome, message):
            log.info("workflow run %s complete: %s", run.pk, outcome)
        return None
    if run.cancel_requested:
        return None  # cancel_run skipped the pending steps and is cancelling the rest
    try:
        document = parsed(run.revision_id)
    except DocumentError as exc:
        # Saved under older rules (a budget since lowered): nothing more of it can start,
        # and asking again would fail the same way for ever.
        why = _reason(f"Skipped: its workflow's revision is not valid any more: {exc}")
        skipped = [step.skip(why) for step in steps if step.status == StepStatus.PENDING]
        if any(skipped):
            return _advance(run_id, requeue, inline)
        return None
    by_name = {step.name: step for step in steps}
    ready = [
        step.pk
        for step in steps
        if step.status == StepStatus.PENDING
        and (requeue or step.queued_at is None)
        and all(by_name[name].resolved for name in document.step(step.name).after)
    ]
    if ready and not requeue:
        # Every step that ends advances the run: without this, each would send a start for
        # every ready step again (50 independent steps: 1,275 messages instead of 50).
        StepRun.objects.filter(pk__in=ready).update(queued_at=timezone.now())
    if inline and len(ready) == 1:
        return str(ready[0])
    for step_id in ready:
        _queue(START_STEP, step_id)
    return None


# What advance reads on every step's end, and start_step of the step it starts, by statements
# written once per process (relay.rows): Django compiling them took longer than PostgreSQL
# answering them, most of a hop's time in the worker.
_locked_run = rows.Select(WorkflowRun, None, where=("id",), lock=True)
_step_states = rows.Select(
    StepRun, ("id", "run", "index", "name", "status", "message", "excused", "queued_at"), where=("run",)
)
_step_with_run = rows.Chain(
    StepRun, ("run", "workflow"), where="id", exclude={StepRun: ("outputs", "decorators", "output_metadata")}
)


def _steps(run: WorkflowRun, *fields: str) -> "models.QuerySet[StepRun]":
    """The run's steps with name, status and `fields` loaded (a reverse relation's manager
    would load each row's run_id again, one query a row, were it not among them)."""
    return run.steps.only("id", "run_id", "name", "status", *fields)


def _outcome(run: WorkflowRun, steps: list[StepRun]) -> tuple[str, str]:
    broken = [step for step in steps if step.status == StepStatus.SYSTEM_ERROR]
    if broken:
        return RunOutcome.SYSTEM_ERROR, f"Step {broken[0].name!r} could not be run: {broken[0].message}"
    if run.cancel_requested:
        return RunOutcome.CANCELLED, "Cancelled."
    excused = {name for step in steps for name in step.excused}
    failed = [step.name for step in steps if step.status == StepStatus.FAILURE and step.name not in excused]
    if failed:
        return RunOutcome.FAILURE, "Failed: " + ", ".join(failed) + "."
    return RunOutcome.SUCCESS, ""


class _Undecidable(Exception):
    """A step's `when` or spec cannot be evaluated; the message says why, for its author."""


def start_step(step_id: str, inline: bool = False) -> str | None:
    """Decide a pending step whose predecessors have ended, and start it (exactly once).

    Bounded like a step in progress: what the step's document or data can never do fails
    it at once, with the reason; any other error is tried again (Celery's retries, then the
    sweeper's) WORKFLOW_STEP_MAX_ATTEMPTS times in all, then fails it.

    With `inline`: the one step its end made ready, if it made exactly one, is returned
    instead of sent (advance), for the caller to start."""
    step = _step_with_run(step_id)
    if step is None or step.status != StepStatus.PENDING:
        return None
    run = step.run
    if run.status != RunStatus.IN_PROGRESS or run.cancel_requested:
        return None
    try:
        return _start(step, run, inline)
    except DocumentError as exc:
        if step.fail_unstarted(_reason(f"Its workflow's revision is not valid any more: {exc}"), []):
            advance(run.pk)
    except Exception as exc:
        if not _count_failed_start(step, exc):
            raise
        advance(run.pk)
    return None


def follow(start: Callable[..., str | None], step_id: str) -> None:
    """`start(step_id, inline=True)` (start_step or resume_step), then the one step each end made
    ready, in this worker, without a trip through the broker, for up to
    WORKFLOW_INLINE_SECONDS; what is left then is sent. Each step is still claimed, leased
    and recorded as it would be from its own message, and its `queued_at` was committed
    with its predecessor's end: a worker that dies here leaves it to the sweeper, as a lost
    message. A step started so has that much less of its task's soft time limit, never
    more time than its lease."""
    deadline = time.monotonic() + settings.WORKFLOW_INLINE_SECONDS
    following = start(step_id, inline=True)
    while following is not None:
        if time.monotonic() >= deadline:
            _queue(START_STEP, following)
            return
        try:
            following = start_step(following, inline=True)
        except Exception:
            # Its own message's retry, as Celery would have made it (retry_backoff).
            log.warning("workflow step %s: start failed in line; sent again", following, exc_info=True)
            _queue(START_STEP, following, countdown=1)
            return


def _count_failed_start(step: StepRun, exc: Exception) -> bool:
    """One more failed start of a pending step; True when that was its last, and it failed."""
    log.warning("workflow step %s: start failed (%s)", step.pk, type(exc).__name__, exc_info=True)
    StepRun.objects.filter(pk=step.pk, status=StepStatus.PENDING).update(attempts=models.F("attempts") + 1)
    attempts = StepRun.objects.filter(pk=step.pk).values_list("attempts", flat=True).first() or 0
    if attempts < settings.WORKFLOW_STEP_MAX_ATTEMPTS:
        return False
    return step.fail_unstarted(
        _reason(f"Could not be started after {attempts} attempts: {type(exc).__name__}: {exc}"), []
    )


def _reason(text: str) -> str:
    """A message for a step or run: no NUL (PostgreSQL's text cannot hold one), and short."""
    text = text.replace("\x00", "\\u0000")
    return text if len(text) <= 2000 else text[:2000] + "…"


def _start(step: StepRun, run: WorkflowRun, inline: bool = False) -> str | None:
    document = parsed(run.revision_id)
    spec = document.step(step.name)
    found = _step_data(run.pk)  # name, status, outputs
    status = {name: value for name, value, _ in found}
    if not all(status[name] in RESOLVED for name in spec.after):
        return None  # an early or repeated message; advance queues it again when it is time
    not_success = [name for name in spec.needs if status[name] != StepStatus.SUCCESS]
    if not_success:
        which = ", ".join(f"{name!r} ended {status[name]}" for name in not_success)
        if step.skip(f"Skipped: it depends on steps that did not succeed ({which})."):
            advance(run.pk)
        return None

    data = _data_of(run, found)
    lookups = _Lookups(run)
    try:
        holds, excused = _conditions(spec, data, lookups)
    except _Undecidable as exc:
        if step.fail_unstarted(_reason(str(exc)), []):
            advance(run.pk)
        return None
    if not holds:
        if step.skip("Skipped: its `when` is false.", excused):
            advance(run.pk)
        return None

    if step.kind == StepKind.APPROVAL:
        step.await_answer(settings.APPROVAL_TIMEOUT, excused)
        return None
    if registry.handler_for(step.image) is None:
        if step.fail_unstarted(unknown_image_message(step.image), excused):
            advance(run.pk)
        return None
    lease = step.claim(settings.WORKFLOW_STEP_LEASE, excused)
    if lease is None:
        return None  # another message (or worker) started it
    return _work(step, run, lease, "start", data, lookups, inline)


def resume_step(step_id: str, inline: bool = False) -> str | None:
    """A step in progress: checked again (woken, or its recheck time came), started again
    (its worker died before recording the start), or cancelled (its run was). Bounded: a step
    tried WORKFLOW_STEP_MAX_ATTEMPTS times without an outcome ends `system-error`."""
    step = StepRun.objects.select_related("run", "run__workflow").filter(pk=step_id).first()
    if step is None or step.status != StepStatus.IN_PROGRESS:
        return None
    run = step.run
    if step.kind == StepKind.APPROVAL:
        _resume_approval(step, run)
        return None
    lease = None
    for _ in range(3):
        lease = step.reclaim(settings.WORKFLOW_STEP_LEASE, settings.WORKFLOW_STEP_MAX_ATTEMPTS)
        if lease is not None:
            break
        if step.give_up(settings.WORKFLOW_STEP_MAX_ATTEMPTS):
            log.warning("workflow step %s gave up: %s", step.pk, step.message)
            _halt(run)
            return None
        if step.mark_woken():
            return None  # a worker holds it now, and will look again when it is done
        step.refresh_from_db()
        if step.status != StepStatus.IN_PROGRESS:
            return None
    if lease is None:
        return None
    if WorkflowRun.objects.filter(pk=run.pk, cancel_requested=True).exists():
        _cancel_held(step, run, lease)
        return None
    steps = _steps(run, "outputs")
    phase: Literal["start", "check"] = "start" if step.state is None else "check"
    return _work(step, run, lease, phase, _data(run, steps), _Lookups(run), inline)


def _resume_approval(step: StepRun, run: WorkflowRun) -> None:
    if WorkflowRun.objects.filter(pk=run.pk, cancel_requested=True).exists():
        ended = step.cancel_waiting("Cancelled with the run before anyone answered.")
    elif step.recheck_at is not None and step.recheck_at <= timezone.now():
        ended = step.time_out(f"No answer within {(step.state or {}).get('timeout')} seconds.")
    else:
        return
    if ended:
        advance(run.pk)


def _work(
    step: StepRun,
    run: WorkflowRun,
    lease: Any,
    phase: Literal["start", "check"],
    data: Data,
    lookups: "_Lookups",
    inline: bool = False,
) -> str | None:
    """Call the handler with the step held by `lease`, and record what it says.

    The handler's database writes, the record of its outcome and the run's advance (its
    successors marked, their starts sent once it commits, the run completed) commit
    together, one transaction: if the worker dies, or loses its lease to the sweeper,
    before that commit, none of its writes stay (a Puppet run is created once), and the
    step is started again. Work outside the database (a Slack post) may then be done twice.
    Returns the step to start in line (advance's `inline`)."""
    handler = registry.handler_for(step.image)
    if handler is None:  # not runnable any more (this worker's settings differ)
        _end(step, run, lease, StepStatus.FAILURE, unknown_image_message(step.image))
        return None
    following = None
    try:
        ctx = _context(step, run, data, lookups)
        with transaction.atomic():
            outcome = handler.start(ctx) if phase == "start" else handler.check(ctx)
            if not _record(step, lease, outcome):
                raise _LeaseLost
            if isinstance(outcome, Done):
                following = _advance(run.pk, False, inline)
    except _Undecidable as exc:
        _end(step, run, lease, StepStatus.FAILURE, _reason(str(exc)))
        return None
    except _LeaseLost:
        log.info("workflow step %s: lease lost during %s; its outcome is dropped", step.pk, phase)
        return None
    except Exception as exc:
        # The worker could not do its job (database, Vault, a bug): try again later, a
        # bounded number of times (resume_step gives up).
        retry_after = min(2 ** max(step.attempts - 1, 0), 300)
        log.warning("workflow step %s: %s failed (attempt %d)", step.pk, phase, step.attempts, exc_info=True)
        if step.release(lease, f"Attempt {step.attempts} failed: {type(exc).__name__}: {exc}", retry_after):
            _queue(RESUME_STEP, step.pk, countdown=retry_after)
        return None
    if isinstance(outcome, Done):
        return following
    if step.take_wake() or WorkflowRun.objects.filter(pk=run.pk, cancel_requested=True).exists():
        _queue(RESUME_STEP, step.pk)
    return None


class _LeaseLost(Exception):
    pass


def _record(step: StepRun, lease: Any, outcome: Outcome) -> bool:
    if isinstance(outcome, Done) and outcome.system_error:
        return step.end(lease, StepStatus.SYSTEM_ERROR, outcome.message)
    if isinstance(outcome, Done):
        return step.record_done(lease, outcome.success, dict(outcome.outputs), outcome.message)
    if isinstance(outcome, Wait):
        return step.record_wait(
            lease, dict(outcome.state), dict(outcome.outputs), outcome.recheck_at, outcome.wake_on
        )
    raise TypeError(f"a step handler returned {type(outcome).__name__}, not Done or Wait")


def _end(step: StepRun, run: WorkflowRun, lease: Any, status: str, message: str) -> None:
    if step.end(lease, status, message):
        advance(run.pk)


def unknown_image_message(image: str) -> str:
    runnable = registry.runnable_images()
    can = ", ".join(runnable) if runnable else "none yet"
    return (
        f"No step here runs the image {image!r}. The images this service runs itself: {can} "
        "(relaysh/core runs its script in a sandbox, any tag). Other images need a container "
        "runtime, and none is configured: set STEP_CONTAINER_RUNTIME=podman (or docker) on the "
        "workers to run them."
    )


# Answering and cancelling --------------------------------------------------------------------


def answer(step: StepRun, user: Any, approve: bool) -> None:
    """Approve or reject an approval waiting for its answer; the run goes on at once.
    Raises models.Conflict when it is not waiting for one. (Who may answer is the caller's
    check: the `workflows.approve_steprun` permission.)"""
    if approve:
        step.approve(user)
    else:
        step.reject(user)
    _queue(ADVANCE_RUN, step.run_id)


def cancel_run(run: WorkflowRun) -> None:
    """Pending steps are skipped, approvals waiting for an answer cancelled, and steps in
    progress cancelled through their handler (a Puppet run through its own cancel). Raises
    models.Conflict when the run is complete."""
    run.request_cancel()
    _stop(run)
    log.info("workflow run %s cancelled", run.pk)


def _halt(run: WorkflowRun) -> None:
    """A step ended `system-error`: the rest of the run stops (RFC 0005)."""
    WorkflowRun.objects.filter(pk=run.pk).exclude(status=RunStatus.COMPLETE).update(cancel_requested=True)
    _stop(run)


def _stop(run: WorkflowRun) -> None:
    for step in run.steps.filter(status=StepStatus.PENDING):
        step.skip("Skipped: the run was stopped before this step started.")
    for step in run.steps.filter(status=StepStatus.IN_PROGRESS):
        if step.kind == StepKind.APPROVAL:
            step.cancel_waiting("Cancelled with the run before anyone answered.")
        else:
            _queue(RESUME_STEP, step.pk)  # takes the step from its worker, then cancels
    advance(run.pk)


def _cancel_held(step: StepRun, run: WorkflowRun, lease: Any) -> None:
    if step.state is not None:  # started: it may have work going on outside (a Puppet run)
        handler = registry.handler_for(step.image)
        try:
            steps = _steps(run, "outputs")
            if handler is not None:
                handler.cancel(_context(step, run, _data(run, steps), _Lookups(run)))
        except Exception:
            log.warning(
                "workflow step %s: its cancel failed; ending it cancelled anyway", step.pk, exc_info=True
            )
        message = "Cancelled with the run."
    else:
        message = "Cancelled with the run before its start was recorded."
    _end(step, run, lease, StepStatus.CANCELLED, message)


# Waking --------------------------------------------------------------------------------------


def wake(kind: str, key: str) -> int:
    """Check again, now, every step waiting on (kind, key), e.g. ("puppet-run", run id).
    Returns how many were queued."""
    ids = list(
        StepRun.objects.filter(status=StepStatus.IN_PROGRESS, wake_kind=kind, wake_key=key).values_list(
            "pk", flat=True
        )
    )
    for step_id in ids:
        _queue(RESUME_STEP, step_id)
    return len(ids)


def sweep(now: datetime | None = None) -> int:
    """Re-queue what a lost message or a killed worker left behind; returns how many. Runs
    from beat every WORKFLOW_SWEEP_INTERVAL seconds.

    - runs still `initializing` after WORKFLOW_STUCK_AFTER seconds (start_run was lost);
    - steps whose worker's lease ran out (it died), or whose recheck time came;
    - runs in progress where nothing changed for WORKFLOW_STUCK_AFTER seconds and a step is
      pending or every step has ended (a lost start_step or advance)."""
    now = now or timezone.now()
    stuck = now - timedelta(seconds=settings.WORKFLOW_STUCK_AFTER)
    queued = 0
    for run_id in WorkflowRun.objects.filter(status=RunStatus.INITIALIZING, created_at__lt=stuck).values_list(
        "pk", flat=True
    )[:1000]:
        _queue(START_RUN, run_id)
        queued += 1
    due = models.Q(status=StepStatus.IN_PROGRESS) & (
        models.Q(lease_until__lt=now) | models.Q(lease_id__isnull=True, recheck_at__lte=now)
    )
    for step_id in StepRun.objects.filter(due).order_by("recheck_at").values_list("pk", flat=True)[:1000]:
        _queue(RESUME_STEP, step_id)
        queued += 1
    steps = StepRun.objects.filter(run=OuterRef("pk"))
    idle = (
        WorkflowRun.objects.filter(status=RunStatus.IN_PROGRESS)
        .annotate(last=Max("steps__updated_at"))
        .filter(last__lt=stuck)
        .filter(
            Exists(steps.filter(status=StepStatus.PENDING))
            | ~Exists(steps.exclude(status__in=list(RESOLVED)))
        )
        .order_by("last")
    )
    for run_id in idle.values_list("pk", flat=True)[:1000]:
        _queue(ADVANCE_RUN, run_id, True)
        queued += 1
    if queued:
        log.info("workflow sweep queued %d", queued)
    return queued


# Evaluating ----------------------------------------------------------------------------------


def _data(run: WorkflowRun, steps: Iterable[StepRun]) -> Data:
    """What a step's expressions may read: parameters, outputs and ended steps' statuses
    (secrets and connections are read when an expression asks for them: _Lookups)."""
    return _data_of(run, ((step.name, step.status, step.outputs) for step in steps))


def _data_of(run: WorkflowRun, steps: Iterable[Sequence[Any]]) -> Data:
    """_data from each step's name, status and outputs."""
    outputs: dict[tuple[str, str], Any] = {}
    statuses: dict[str, str] = {}
    for name, status, values in steps:
        for key, value in (values or {}).items():
            outputs[(name, key)] = value
        if status in RESOLVED:
            statuses[name] = status
    return Data(parameters=dict(run.parameters), outputs=outputs, statuses=statuses)


# What resolve reads of a run's steps, on every call of the step runtime API (relay.rows).
_step_data = rows.Select(StepRun, ("name", "status", "outputs"), where=("run",))


class _Lookups:
    """Secrets (from Vault) and connections, read when an evaluation refers to them, each at
    most once."""

    def __init__(self, run: WorkflowRun) -> None:
        self.workflow_id = run.workflow_id
        self.owner_id = run.workflow.owner_id
        self.tried: set[tuple[str, ...]] = set()

    def fill(self, data: Data, missing: Unresolvable) -> bool:
        """Adds what `missing` names and exists; True if anything was added."""
        added = False
        for (name,) in missing.secrets:
            if ("secret", name) not in self.tried:
                self.tried.add(("secret", name))
                value = WorkflowSecret.value_of(self.workflow_id, name)
                if value is not None:
                    data.secrets[name] = value
                    added = True
        for kind, name in missing.connections:
            if ("connection", kind, name) not in self.tried:
                self.tried.add(("connection", kind, name))
                value = registry.resolve_connection(self.owner_id, kind, name)
                if value is not None:
                    data.connections[(kind, name)] = dict(value)
                    added = True
        return added


def _evaluate(tree: Any, data: Data, lookups: _Lookups) -> Result:
    # A reference may be computed from another (secrets[parameters.x]): a few rounds.
    for _ in range(4):
        result = evaluate(tree, data)
        if result.complete or not lookups.fill(data, result.unresolvable):
            return result
    return result


def resolve(run: WorkflowRun, evaluation: Callable[[Data], Result]) -> tuple[Result, Data]:
    """`evaluation(data)` against what `run` knows now (parameters, outputs, ended steps'
    statuses), with secrets and connections read when it asks for them, as a step's start
    evaluates its spec: how the step runtime API (stepruntime) answers a running step.
    Returns the result and the data it used (`data.secrets`: the secrets it read). Raises
    EvaluationError."""
    data = _data_of(run, _step_data(run.pk))
    lookups = _Lookups(run)
    for _ in range(4):
        result = evaluation(data)
        if result.complete or not lookups.fill(data, result.unresolvable):
            break
    return result, data


def describe(missing: Unresolvable) -> str:
    """What an evaluation could not find, as its author would put it."""
    parts = [f"secret {name!r} (not set for this workflow)" for (name,) in sorted(missing.secrets)]
    parts += [
        f"connection {kind} {name!r} (the workflow's owner has none by that name)"
        for kind, name in sorted(missing.connections)
    ]
    parts += [f"output {name!r} of step {step!r} (never set)" for step, name in sorted(missing.outputs)]
    parts += [f"parameter {name!r} (no value)" for (name,) in sorted(missing.parameters)]
    parts += [f"the status of step {name!r}" for (name,) in sorted(missing.statuses)]
    parts += [f"function {name!r} ({why})" for name, why in sorted(missing.invocations)]
    if missing.data:
        parts.append("event data (only triggers have it)")
    parts += [f"answer {name!r} of {ref!r}" for ref, name in sorted(missing.answers)]
    return "; ".join(parts)


def _conditions(spec: StepSpec, data: Data, lookups: _Lookups) -> tuple[bool, list[str]]:
    """Whether the step's `when` holds (every condition true), as relay-core decides it; and
    the failed steps whose failure a true condition on their status excuses (RFC 0005).
    Raises _Undecidable."""
    if spec.when is None:
        return True, []
    items = list(spec.when) if isinstance(spec.when, list) else [spec.when]
    holds, unresolved, excused = True, Unresolvable(), []
    for index, item in enumerate(items):
        where = f"condition {index + 1} of its `when`" if len(items) > 1 else "its `when`"
        try:
            result = _evaluate(item, data, lookups)
        except EvaluationError as exc:
            raise _Undecidable(f"The step cannot be decided: {where} failed: {_masked(exc, data)}") from None
        if not result.complete:
            unresolved.extend(result.unresolvable)
            continue
        if not isinstance(result.value, bool):
            raise _Undecidable(
                f"The step cannot be decided: {where} is {type_name(result.value)}, not true or false."
            )
        if not result.value:
            holds = False
            continue
        excused += [
            name for name in _status_references(item) if data.statuses.get(name) == StepStatus.FAILURE
        ]
    if holds and unresolved:
        raise _Undecidable(f"The step cannot be decided: its `when` refers to {describe(unresolved)}.")
    return holds, list(dict.fromkeys(excused))


def _status_references(tree: Any) -> list[str]:
    """The steps a condition reads the status of (`!Status name`)."""
    found: list[str] = []
    if isinstance(tree, dict):
        if tree.get("$type") == "Status" and isinstance(tree.get("name"), str):
            found.append(tree["name"])
        for value in tree.values():
            found += _status_references(value)
    elif isinstance(tree, list):
        for value in tree:
            found += _status_references(value)
    return found


def _context(step: StepRun, run: WorkflowRun, data: Data, lookups: _Lookups) -> StepContext:
    """The handler's view of its step, with spec and env evaluated now (secrets are read
    from Vault for each call and kept nowhere). Raises _Undecidable."""
    container = parsed(run.revision_id).step(step.name).container
    assert container is not None
    values = {}
    for name, tree in (("spec", dict(container.spec)), ("env", dict(container.env))):
        try:
            result = _evaluate(tree, data, lookups)
        except EvaluationError as exc:
            raise _Undecidable(f"Its {name} could not be evaluated: {_masked(exc, data)}") from None
        if not result.complete:
            raise _Undecidable(f"Its {name} refers to what is not there: {describe(result.unresolvable)}.")
        values[name] = result.value
    return StepContext(
        step_run_id=str(step.pk),
        run_id=str(run.pk),
        owner_id=run.workflow.owner_id,
        step_name=step.name,
        image=step.image,
        spec=values["spec"],
        env=values["env"],
        state=dict(step.state or {}),
        started_at=step.started_at or timezone.now(),
        input=tuple(container.input),
        command=container.command,
        args=tuple(container.args),
        secrets=_secret_values(data),
    )


def _masked(error: EvaluationError, data: Data) -> str:
    """An evaluation's error as its step's message shows it to people: an error may quote a
    value it met (`${-secrets.pw}`: relay-core's "unexpected <value>(string) expected
    number"), so what the evaluation read of secrets and connections is masked there too."""
    masker = Masker(_secret_values(data))
    return masker.feed(str(error)) + masker.flush()


def shown_spec(step: StepRun) -> tuple[Any, str]:
    """The step's spec evaluated as its start evaluates it, now (the run's parameters and
    outputs, the workflow's secrets and its owner's connections as they are now), for people
    (the run page): whatever it read of secrets and connections, and the run's sensitive
    outputs, masked as the step's log masks them. Returns (value, what is missing or why it
    cannot be evaluated: "" when it is whole); (None, "") for a step without a spec."""
    container = parsed(step.run.revision_id).step(step.name).container
    if container is None:
        return None, ""
    tree = dict(container.spec)
    read = Data()

    def evaluation(data: Data) -> Result:
        nonlocal read
        read = data
        return evaluate(tree, data)

    try:
        result, read = resolve(step.run, evaluation)
    except EvaluationError as exc:
        return None, f"It cannot be evaluated: {_masked(exc, read)}"
    hidden = [
        *_secret_values(read),
        *(s for v in StepRun.sensitive_values(step.run_id) for s in strings_in(v)),
    ]
    value = _masked_tree(result.value, Masker(hidden)) if hidden else result.value
    return (
        value,
        "" if result.complete else f"It refers to what is not there yet: {describe(result.unresolvable)}.",
    )


def _masked_tree(value: Any, masker: Masker) -> Any:
    """`value` with each of its strings masked by `masker` (each whole: flushed)."""
    if isinstance(value, str):
        return masker.feed(value) + masker.flush()
    if isinstance(value, Mapping):
        return {key: _masked_tree(item, masker) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_masked_tree(item, masker) for item in value]
    return value


def _secret_values(data: Data) -> tuple[str, ...]:
    """What a step must not show: the secrets and connections its evaluation read (a
    connection's URLs without credentials excepted: they are addresses, not secrets), and
    the strings of a secret that holds JSON (AWS keys, a service account's key), which the
    step's spec may take apart (jsonUnmarshal) and the step print one by one."""
    found = []
    for value in data.secrets.values():
        found += _strings(value) + _json_strings(value)
    for connection in data.connections.values():
        found += [value for value in _strings(connection) if not _plain_url(value)]
    return tuple(dict.fromkeys(found))


def _json_strings(value: Any) -> list[str]:
    if not isinstance(value, str) or not value.lstrip().startswith(("{", "[")):
        return []
    try:
        return _strings(json.loads(value))
    except (ValueError, RecursionError):
        return []


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for item in value.values() for s in _strings(item)]
    if isinstance(value, list | tuple):
        return [s for item in value for s in _strings(item)]
    return []


def _plain_url(value: str) -> bool:
    parts = urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.netloc) and "@" not in parts.netloc


class ContextError(Exception):
    """A step's spec or env cannot be evaluated any more; the message says why."""


def context_of(step_id: str) -> StepContext:
    """A step in progress as its handler sees it, evaluated now: for the work a handler
    leaves to another task (a script step's sandbox, scriptsteps.services), which reads its
    secrets from Vault itself rather than through the broker. Raises ContextError."""
    step = StepRun.objects.select_related("run", "run__workflow").get(pk=step_id)
    run = step.run
    try:
        return _context(step, run, _data(run, _steps(run, "outputs")), _Lookups(run))
    except _Undecidable as exc:
        raise ContextError(str(exc)) from None


# Queueing ------------------------------------------------------------------------------------


def _queue(task: str, object_id: Any, *args: Any, countdown: float | None = None) -> None:
    """Send task `task` (its name: START_STEP…) after the current transaction commits (at
    once outside one), so no worker looks for a row it cannot see yet. A broker that is down
    loses nothing: the sweeper sends it again."""

    def send() -> None:
        try:
            dispatch.publish(task, str(object_id), *args, countdown=countdown)
        except Exception:
            log.warning("could not queue %s(%s); the sweeper will", task, object_id)

    transaction.on_commit(send)
