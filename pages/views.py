"""The workflow and run pages. Views are thin: fetch what the user may see
(workflows.permissions, as the API and the admin do), ask the engine, render."""

import difflib
import hashlib
import itertools
import json
from datetime import datetime
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required as _login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from pages import graph
from pages.forms import RunForm
from pages.previews import scope_previews
from workflows import engine
from workflows.dialect.problems import DocumentError
from workflows.models import (
    Conflict,
    OverBudget,
    RunOutcome,
    RunStatus,
    StepRun,
    StepStatus,
    Workflow,
    WorkflowRevision,
    WorkflowRun,
)
from workflows.permissions import Action, may, runs_for, workflows_for

HISTORY = 50  # runs listed on a workflow's page

# The admin's login form, open to every active user (the admin's own admits staff alone).
login_required = _login_required(login_url="pages:login")


def duration(start: datetime | None, end: datetime | None) -> str:
    """ "1h 02m 03s", "4m 05s", "7s"; "" before it started; to now while it runs."""
    if start is None:
        return ""
    seconds = max(0, int(((end or timezone.now()) - start).total_seconds()))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m {seconds:02d}s"
    return f"{minutes}m {seconds:02d}s" if minutes else f"{seconds}s"


def run_status(run: WorkflowRun) -> str:
    """One word for a run: its outcome once complete, else its status."""
    return run.outcome if run.status == RunStatus.COMPLETE and run.outcome else run.status


# The words a run's status is shown and filtered by: its status until complete, then its outcome.
STATUS_WORDS = (RunStatus.INITIALIZING, RunStatus.IN_PROGRESS, *RunOutcome.values)


def runs_of(workflow: Workflow, status_word: str = "") -> QuerySet[WorkflowRun]:
    """The workflow's runs, newest first, those with `status_word` only when given."""
    runs = WorkflowRun.objects.filter(workflow=workflow)
    if status_word in RunOutcome.values:
        runs = runs.filter(status=RunStatus.COMPLETE, outcome=status_word)
    elif status_word:
        runs = runs.filter(status=status_word)
    return runs.select_related("created_by").order_by("-created_at", "-id")


def not_after(run: WorkflowRun) -> Q:
    """Runs created before `run`, or with it: #1 is a workflow's first run."""
    return Q(created_at__lt=run.created_at) | Q(created_at=run.created_at, id__lte=run.id)


def number(rows: list[WorkflowRun]) -> None:
    """Give each of `rows` (one workflow's, newest first) its `number`, with two queries
    whatever the workflow's history: the runs before the oldest row are counted, and those
    from it to the newest listed (a filtered list's rows are not consecutive)."""
    if not rows:
        return
    oldest, newest = rows[-1], rows[0]
    runs = WorkflowRun.objects.filter(workflow_id=oldest.workflow_id)
    before = runs.filter(not_after(oldest)).count() - 1
    keys = runs.filter(created_at__gte=oldest.created_at, created_at__lte=newest.created_at).order_by(
        "created_at", "id"
    )
    within = [
        pk
        for created_at, pk in keys.values_list("created_at", "id")
        if (created_at, pk) >= (oldest.created_at, oldest.id)
    ]
    position = {pk: before + i + 1 for i, pk in enumerate(within)}
    for row in rows:
        row.number = position[row.pk]  # type: ignore[attr-defined]


def started_by(run: WorkflowRun) -> str:
    if run.created_by is not None:
        return run.created_by.get_username()
    if run.schedule_id is not None:
        return "a schedule"
    if run.event_id is not None:
        return "a trigger's event"
    if run.parent_step_id is not None:
        return "a step of another run"
    return "—"


def with_changes(revisions: list[WorkflowRevision]) -> list[WorkflowRevision]:
    """The revisions, newest first, less the last (one more than shown is asked for), each with
    `changes`: its document's differences from the revision before it, as (css class, line)."""
    for revision, before in itertools.pairwise(revisions):
        lines = difflib.unified_diff(
            before.source.splitlines(),
            revision.source.splitlines(),
            f"revision {before.number}",
            f"revision {revision.number}",
            lineterm="",
        )
        revision.changes = [(DIFF_CLASSES.get(line[:1], ""), line) for line in lines]  # type: ignore[attr-defined]
    return revisions[:HISTORY]


DIFF_CLASSES = {"+": "added", "-": "removed", "@": "hunk"}


def _workflow(request: HttpRequest, workflow_id: Any) -> Workflow:
    return get_object_or_404(
        workflows_for(request.user, Workflow.objects.select_related("owner")), pk=workflow_id
    )


def _run(request: HttpRequest, run_id: Any) -> WorkflowRun:
    runs = WorkflowRun.objects.select_related("workflow__owner", "revision", "created_by")
    return get_object_or_404(runs_for(request.user, runs), pk=run_id)


@login_required
def workflow_list(request: HttpRequest) -> HttpResponse:
    workflows = workflows_for(request.user, Workflow.objects.select_related("owner")).order_by("name")
    return render(request, "pages/workflow_list.html", {"workflows": workflows})


@login_required
def workflow_detail(request: HttpRequest, workflow_id: Any) -> HttpResponse:
    workflow = _workflow(request, workflow_id)
    revision = workflow.latest_revision()
    document = engine.parsed(revision.pk) if revision is not None else None
    wanted = request.GET.get("status", "")
    if wanted and wanted not in STATUS_WORDS:
        return HttpResponseBadRequest(f"No status {wanted!r}: one of {', '.join(STATUS_WORDS)}.")
    runs = []
    if may(request.user, Action.VIEW_RUNS, workflow):
        shown = list(runs_of(workflow, wanted)[:HISTORY])
        number(shown)
        for run in shown:
            run.status_word = run_status(run)  # type: ignore[attr-defined]
            run.duration = duration(run.started_at, run.ended_at)  # type: ignore[attr-defined]
            run.started_by = started_by(run)  # type: ignore[attr-defined]
            runs.append(run)
    return render(
        request,
        "pages/workflow_detail.html",
        {
            "workflow": workflow,
            "revision": revision,
            "document": document,
            "svg": graph.workflow_svg(document) if document is not None else "",
            "runs": runs,
            "revisions": with_changes(
                list(workflow.revisions.select_related("created_by").order_by("-number")[: HISTORY + 1])
            ),
            "may_run": may(request.user, Action.RUN, workflow) and document is not None,
            "may_view_runs": may(request.user, Action.VIEW_RUNS, workflow),
            "status_words": STATUS_WORDS,
            "wanted": wanted,
        },
    )


@login_required
def run_form(request: HttpRequest, workflow_id: Any) -> HttpResponse:
    """The Run button: a form of the newest revision's parameters; a valid one starts a run
    and lands on its page."""
    workflow = _workflow(request, workflow_id)
    if not may(request.user, Action.RUN, workflow):
        raise PermissionDenied("A workflow's runs are started by its owner alone.")
    revision = workflow.latest_revision()
    if revision is None:
        raise Http404("The workflow has no revision.")
    parameters = dict(engine.parsed(revision.pk).parameters)
    form = RunForm(parameters, request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        try:
            run = engine.create_run(workflow, form.values, created_by=request.user)
        except engine.ParameterError as exc:
            for name in exc.missing:
                form.add_error(name, "A required parameter has no value.")
            for name, why in exc.invalid.items():
                form.add_error(name, f"The value cannot be a parameter: {why}.")
        except (OverBudget, DocumentError) as exc:
            form.add_error(None, str(exc))
        else:
            return redirect("pages:run", run_id=run.pk)
    return render(request, "pages/run_form.html", {"workflow": workflow, "form": form}, status=200)


def evidence(run: WorkflowRun, before: tuple[str, ...]) -> list[tuple[str, str, str, str]]:
    """What an approval approves: the steps before it, their status, message and outputs
    (sensitive ones masked), as the admin's approval page shows them."""
    rows = StepRun.objects.filter(run=run, name__in=before).order_by("index")
    return [
        (row.name, row.status, row.message, json.dumps(row.shown_outputs, indent=2, sort_keys=True))
        for row in rows
    ]


def _run_context(request: HttpRequest, run: WorkflowRun) -> dict[str, Any]:
    steps = list(
        StepRun.objects.filter(run=run).defer("outputs", "state", "decorators").select_related("decided_by")
    )
    document = engine.parsed(run.revision_id)
    may_approve = may(request.user, Action.APPROVE, run.workflow)
    for step in steps:
        # Only once ended: a duration ticking each second would change the page each second.
        step.duration = duration(step.started_at, step.ended_at) if step.ended_at else ""  # type: ignore[attr-defined]
        step.waiting = step.kind == "approval" and step.status == StepStatus.IN_PROGRESS  # type: ignore[attr-defined]
        step.question = document.step(step.name).description if step.kind == "approval" else ""  # type: ignore[attr-defined]
        if step.waiting:  # type: ignore[attr-defined]
            step.evidence = evidence(run, document.step(step.name).after)  # type: ignore[attr-defined]
            step.previews = scope_previews(run, document, step.name)  # type: ignore[attr-defined]
    shown = {step.name: (step.status, step.duration) for step in steps}  # type: ignore[attr-defined]
    complete = run.status == RunStatus.COMPLETE
    may_cancel = not complete and may(request.user, Action.CANCEL, run.workflow)
    seen = [
        (run.status, run.outcome, run.message, run.started_at, run.ended_at, may_approve, may_cancel),
        *((s.status, s.decision, s.decided_by_id, s.message, s.started_at, s.ended_at) for s in steps),
    ]
    return {
        "version": hashlib.sha256(repr(seen).encode()).hexdigest()[:16],
        "run": run,
        "status_word": run_status(run),
        "duration": duration(run.started_at, run.ended_at) if run.ended_at else "",
        "started_by": started_by(run),
        "steps": steps,
        "svg": graph.workflow_svg(document, shown),
        "complete": complete,
        "may_approve": may_approve,
        "may_cancel": may_cancel,
    }


@login_required
def run_detail(request: HttpRequest, run_id: Any) -> HttpResponse:
    run = _run(request, run_id)
    context = _run_context(request, run)
    context["number"] = WorkflowRun.objects.filter(workflow_id=run.workflow_id).filter(not_after(run)).count()
    return render(request, "pages/run_detail.html", context)


@login_required
def run_live(request: HttpRequest, run_id: Any) -> HttpResponse:
    """The run page's changing part, which the page asks for each second until the run ends:
    204 while what it shows has not changed (htmx then leaves the page alone, and the focus
    where it was)."""
    run = _run(request, run_id)
    context = _run_context(request, run)
    if request.headers.get("X-Live-Version") == context["version"]:
        return HttpResponse(status=204)
    return render(request, "pages/_run_live.html", context)


@login_required
@require_POST
def answer(request: HttpRequest, run_id: Any, step: str, approve: bool) -> HttpResponse:
    run = _run(request, run_id)
    if not may(request.user, Action.APPROVE, run.workflow):
        raise PermissionDenied(
            "Answering approvals needs the permission to approve them (workflows.approve_steprun)."
        )
    step_run = get_object_or_404(StepRun, run=run, name=step)
    try:
        engine.answer(step_run, request.user, approve)
    except Conflict as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"{'Approved' if approve else 'Rejected'}: {step}.")
    return redirect("pages:run", run_id=run.pk)


@login_required
@require_POST
def cancel(request: HttpRequest, run_id: Any) -> HttpResponse:
    run = _run(request, run_id)
    if not may(request.user, Action.CANCEL, run.workflow):
        raise PermissionDenied("You may not cancel runs of another user's workflow.")
    try:
        engine.cancel_run(run)
    except Conflict as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, "Cancelling: steps not started are skipped, steps in progress stopped.")
    return redirect("pages:run", run_id=run.pk)
