"""Runs that push events start.

A workflow's push trigger (a triggers.Trigger its document declares: Workflow.add_revision)
receives Puppet reports like any trigger; the worker reads each one, applies the trigger's
filters and records it `matched` with its data (triggers.services). Then, in a task of its
own (workflows.tasks.start_run_for_event), start_run_for_event evaluates the trigger's `when`
with that data as `event`, binds the parameters (`binding.parameters`: `!Data host`,
`${event.noop}`) and starts a run of the workflow linked to the event.
"""

import logging
from collections.abc import Mapping
from typing import Any

from django.db import transaction

from triggers.models import Event, WorkflowStart
from triggers.reports import EVENT_DATA_MAX_BYTES
from workflows import engine
from workflows.dialect.errors import EvaluationError
from workflows.dialect.evaluate import Data, evaluate
from workflows.dialect.values import type_name
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
        spec = _push_trigger(revision, event.trigger.name)
        if workflow is None or revision is None or spec is None:
            # The revision that removed the trigger is being saved: the trigger goes with it.
            _skip(event, f"The workflow no longer has a push trigger named {event.trigger.name!r}.")
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


def _push_trigger(revision: Any, name: str) -> TriggerSpec | None:
    if revision is None:
        return None
    for trigger in engine.parsed(revision.pk).triggers:
        if trigger.kind == "push" and trigger.name == name:
            return trigger
    return None


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
        if result.complete:
            parameters[name] = result.value
        else:
            unbound[name] = f"it refers to {engine.describe(result.unresolvable)}"
    return parameters, unbound
