"""Runs that triggers start: push and webhook events, and schedules.

A workflow's push trigger (a triggers.Trigger its document declares: Workflow.add_revision)
receives Puppet reports like any trigger; the worker reads each one, applies the trigger's
filters and records it `matched` with its data (triggers.services). Then, in a task of its
own (workflows.tasks.start_run_for_event), start_run_for_event evaluates the trigger's `when`
with that data as `event`, binds the parameters (`binding.parameters`: `!Data host`,
`${event.noop}`) and starts a run of the workflow linked to the event. A webhook trigger's
event (triggers.webhooks) goes the same way, its JSON body being its data.

Schedule triggers (triggers.Schedule) start runs from beat: start_due_schedules.
"""

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from triggers.models import Event, Schedule, WorkflowStart
from triggers.reports import EVENT_DATA_MAX_BYTES
from workflows import engine
from workflows.dialect import cron
from workflows.dialect.errors import EvaluationError
from workflows.dialect.evaluate import Data, evaluate
from workflows.dialect.problems import DocumentError
from workflows.dialect.values import type_name, unstorable
from workflows.dialect.workflow import Trigger as TriggerSpec
from workflows.models import WorkflowRun

log = logging.getLogger(__name__)


def start_run_for_event(event_id: str) -> WorkflowRun | None:
    """Start the run a workflow trigger's matched event asks for, or record why there is
    none (in the event's filter_note); returns the run.

    Once per event however often it is called: the event's row is locked, and in the same
    transaction its `workflow_start` leaves `pending` (a compare-and-set) and the run is
    made, which the database allows one of per event (WorkflowRun's one_run_per_event)."""
    with transaction.atomic():
        event = (
            Event.objects.select_for_update(of=("self",))
            .select_related("trigger__workflow__owner")
            .filter(pk=event_id, workflow_start=WorkflowStart.PENDING)
            .first()
        )
        if event is None:
            return None  # started or skipped already (or deleted)
        workflow = event.trigger.workflow
        revision = workflow.latest_revision() if workflow is not None else None
        kind = event.trigger.kind
        try:
            spec = _trigger_spec(revision, kind, event.trigger.name)
        except DocumentError as exc:
            _skip(event, f"The workflow's newest revision is not valid any more: {exc}")
            return None
        if workflow is None or revision is None or spec is None:
            # The revision that removed the trigger is being saved: the trigger goes with it.
            _skip(event, f"The workflow no longer has a {kind} trigger named {event.trigger.name!r}.")
            return None
        if event.data is None:
            _skip(event, f"Its data is larger than {EVENT_DATA_MAX_BYTES} bytes: no workflow run.")
            return None
        data = Data(event=event.data, event_available=True)
        holds, why = _holds(spec.when, data)
        if not holds:
            _skip(event, why)
            return None
        parameters, unbound = _bind(spec.binding_parameters, data)
        run = engine.create_run(
            workflow, parameters, event=event, strict=False, revision=revision, unbound=unbound
        )
        event.end_workflow_start(WorkflowStart.STARTED)
    log.info("event %s started workflow run %s", event.pk, run.pk)
    return run


def give_up_workflow_start(event_id: str, exc: Exception) -> None:
    """The event's run could not be started for a reason trying again would not change."""
    log.error("event %s: its workflow run could not be started", event_id, exc_info=exc)
    event = Event.objects.filter(pk=event_id, workflow_start=WorkflowStart.PENDING).first()
    if event is not None:
        text = f"{type(exc).__name__}: {exc}".replace("\x00", "\\u0000")
        _skip(event, f"Its workflow run could not be started: {text}")


def _trigger_spec(revision: Any, kind: str, name: str) -> TriggerSpec | None:
    if revision is None:
        return None
    for trigger in engine.parsed(revision.pk).triggers:
        if trigger.kind == kind and trigger.name == name:
            return trigger
    return None


# Schedule triggers ------------------------------------------------------------------------------


def start_due_schedules(now: datetime | None = None) -> int:
    """Start a run for each schedule trigger that is due, in the order due_in_turn gives;
    returns how many started. Safe to run from any number of beats and workers at once: each
    slot is taken once (start_scheduled_run)."""
    now = now or timezone.now()
    return sum(start_scheduled_run(pk, now) is not None for pk in due_in_turn(now))


def due_in_turn(now: datetime) -> list[Any]:
    """The due schedules one tick takes (an index on next_due finds them; nothing else is
    read), fair between owners: owners take turns, each turn every owner's longest-waiting
    schedule, the longest-waiting first, at most SCHEDULES_PER_OWNER_PER_TICK turns and
    SCHEDULES_PER_TICK schedules in all. The rest are due still, and later ticks take them:
    one owner's thousand schedules due at once wait for each other, not everyone else."""
    due = Schedule.objects.filter(next_due__lte=now)
    if not due.exists():
        return []  # most ticks: one look at the index, not the turns' query (0.3 against 8 ms)
    turn = Window(
        RowNumber(), partition_by=[F("workflow__owner_id")], order_by=[F("next_due").asc(), F("id").asc()]
    )
    due = (
        due.annotate(turn=turn)
        .filter(turn__lte=settings.SCHEDULES_PER_OWNER_PER_TICK)
        .order_by("turn", "next_due", "id")
        .values_list("pk", flat=True)
    )
    return list(due[: settings.SCHEDULES_PER_TICK])


def start_scheduled_run(schedule_id: Any, now: datetime) -> WorkflowRun | None:
    """Take the schedule's due slot and start its run, in one transaction; None when another
    worker took the slot first, or its `when` was false (the schedule's last_note says why).

    The next time is the first one after `now`, not after the slot: a schedule that missed
    many slots (the service was down) runs once for them all, then keeps to its times. A
    schedule trigger has no event: its `when` and bindings see `event` as an empty object, as
    on Relay, so `!Data x` there does not resolve and the run says which binding failed."""
    with transaction.atomic():
        schedule = Schedule.objects.select_related("workflow__owner").filter(pk=schedule_id).first()
        if schedule is None or schedule.next_due > now:
            return None
        slot = schedule.next_due
        if not schedule.take(now, cron.parse(schedule.schedule).next_after(now)):
            return None  # another worker took this slot
        workflow = schedule.workflow
        revision = workflow.latest_revision()
        try:
            spec = _trigger_spec(revision, "schedule", schedule.name)
        except DocumentError as exc:
            # Saved under older rules: this slot is taken, and the next one asks again (an
            # error here would undo the take, and every tick would fail on it for ever).
            schedule.note(f"The workflow's newest revision is not valid any more: {exc}")
            return None
        if revision is None or spec is None:
            # The revision that removes it is being saved: the schedule goes with it.
            return None
        data = Data(event={}, event_available=True)
        holds, why = _holds(spec.when, data)
        if not holds:
            schedule.note(why)
            log.info("schedule %s started no run for %s: %s", schedule.pk, slot.isoformat(), why)
            return None
        parameters, unbound = _bind(spec.binding_parameters, data)
        run = engine.create_run(
            workflow,
            parameters,
            strict=False,
            revision=revision,
            unbound=unbound,
            schedule=schedule,
            scheduled_for=slot,
        )
        schedule.note(f"Started run {run.pk}.")
    log.info("schedule %s started workflow run %s for %s", schedule.pk, run.pk, slot.isoformat())
    return run


def _skip(event: Event, why: str) -> None:
    # The filters' note, if any, stays in front: it is still true.
    note = f"{event.filter_note} {why}" if event.filter_note else why
    event.end_workflow_start(WorkflowStart.SKIPPED, note)
    log.info("event %s started no workflow run: %s", event.pk, why)


def _holds(when: Any, data: Data) -> tuple[bool, str]:
    """Whether the trigger's `when` (a condition, or a list that must all be true) holds for
    this event, and if not, why, for its author."""
    if when is None:
        return True, ""
    items = list(when) if isinstance(when, list) else [when]
    for index, item in enumerate(items):
        where = f"Condition {index + 1} of the trigger's `when`" if len(items) > 1 else "The trigger's `when`"
        try:
            result = evaluate(item, data)
        except EvaluationError as exc:
            return False, f"{where} could not be decided: {exc}; no workflow run."
        if not result.complete:
            return (
                False,
                f"{where} could not be decided: it refers to {engine.describe(result.unresolvable)}.",
            )
        if not isinstance(result.value, bool):
            return False, f"{where} is {type_name(result.value)}, not true or false; no workflow run."
        if not result.value:
            return False, f"{where} is false: no workflow run."
    return True, ""


def _bind(bindings: Mapping[str, Any], data: Data) -> tuple[dict[str, Any], dict[str, str]]:
    """The parameters the trigger's binding gives, and those it could not (name → why)."""
    parameters: dict[str, Any] = {}
    unbound: dict[str, str] = {}
    for name, tree in bindings.items():
        try:
            result = evaluate(tree, data)
        except EvaluationError as exc:
            unbound[name] = str(exc)
            continue
        if not result.complete:
            unbound[name] = f"it refers to {engine.describe(result.unresolvable)}"
        elif (why := unstorable(result.value)) is not None:
            # A run's parameters are kept as JSON: such a value would fail every try.
            unbound[name] = f"its value cannot be a parameter: {why}"
        else:
            parameters[name] = result.value
    return parameters, unbound
