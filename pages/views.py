"""The workflow and run pages. Views are thin: fetch what the user may see
(workflows.permissions, as the API and the admin do), ask the engine, render."""

import difflib
import itertools
import json
from datetime import datetime
from typing import Any

from django.contrib import messages
from django.contrib.admin.utils import NestedObjects
from django.contrib.auth.decorators import login_required as _login_required
from django.core.exceptions import PermissionDenied
from django.db import router
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.utils import timezone
from django.views.decorators.http import require_POST

from pages import graph, setup, versions
from pages.forms import RunForm
from workflows import engine
from workflows.admin import puppet_run_of, what_would_change
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
from workflows.previews import scope_previews

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


REVISIONS = 10  # revisions shown on a workflow's page, each with its source and changes
# A document may be 1 MiB: past these the page says so rather than diff or show it (difflib
# took 0.9 s for one pair of 30,000-line documents; 50 such sources were tens of MB of HTML).
DIFF_MAX_LINES = 5_000  # lines of either document diffed
CHANGES_SHOWN = 1_000  # lines of a diff shown
SOURCE_SHOWN = 256 * 1024  # characters of a document shown


def with_changes(revisions: list[WorkflowRevision]) -> list[WorkflowRevision]:
    """The revisions, newest first, less the last (one more than shown is asked for), each with
    `changes`: its document's differences from the revision before it, as (css class, line),
    and `too_large`: why its source or changes are not all shown."""
    for revision, before in itertools.pairwise(revisions):
        old, new = before.source.splitlines(), revision.source.splitlines()
        if max(len(old), len(new)) > DIFF_MAX_LINES:
            revision.changes = [("", f"(not shown here: over {DIFF_MAX_LINES} lines to compare)")]  # type: ignore[attr-defined]
            continue
        lines = difflib.unified_diff(
            old, new, f"revision {before.number}", f"revision {revision.number}", lineterm=""
        )
        changes = [
            (DIFF_CLASSES.get(line[:1], ""), line) for line in itertools.islice(lines, CHANGES_SHOWN + 1)
        ]
        if len(changes) > CHANGES_SHOWN:
            changes[CHANGES_SHOWN:] = [("", f"(the first {CHANGES_SHOWN} lines of the changes)")]
        revision.changes = changes  # type: ignore[attr-defined]
    for revision in revisions:
        revision.shown_source = revision.source[:SOURCE_SHOWN]  # type: ignore[attr-defined]
        revision.cut = len(revision.source) > SOURCE_SHOWN  # type: ignore[attr-defined]
    return revisions[:REVISIONS]


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
        # Plain text: the answer quotes what was asked, which a link can make markup.
        return HttpResponseBadRequest(
            f"No status {wanted!r}: one of {', '.join(STATUS_WORDS)}.",
            content_type="text/plain; charset=utf-8",
        )
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
            "triggers": setup.triggers_of(request.user, workflow, document) if document else [],
            "connections": setup.connections_of(request.user, workflow, document) if document else [],
            "runs": runs,
            "revisions": with_changes(
                list(workflow.revisions.select_related("created_by").order_by("-number")[: REVISIONS + 1])
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


def evidence(run: WorkflowRun, before: tuple[str, ...]) -> list[tuple[str, str, str, str, str]]:
    """What an approval approves: the steps before it, their status, message and outputs
    (sensitive ones masked), and for a Puppet dry run what it would change on each node (or
    why that is not known), as the admin's approval page shows them."""
    rows = StepRun.objects.filter(run=run, name__in=before).order_by("index")
    return [
        (
            row.name,
            row.status,
            row.message,
            json.dumps(row.shown_outputs, indent=2, sort_keys=True),
            what_would_change(row.shown_outputs),
        )
        for row in rows
    ]


def _run_context(run: WorkflowRun, version: str, may_approve: bool, may_cancel: bool) -> dict[str, Any]:
    """What the live part shows of `run` to a user with these rights, read after its
    `version` (pages.versions): a change in between is shown, and the page's next ask, with
    the older version, renders it again."""
    steps = list(
        StepRun.objects.filter(run=run).defer("outputs", "state", "decorators").select_related("decided_by")
    )
    document = engine.parsed(run.revision_id)
    for step in steps:
        # Only once ended: a duration ticking each second would change the page each second.
        step.duration = duration(step.started_at, step.ended_at) if step.ended_at else ""  # type: ignore[attr-defined]
        step.waiting = step.kind == "approval" and step.status == StepStatus.IN_PROGRESS  # type: ignore[attr-defined]
        step.question = document.step(step.name).description if step.kind == "approval" else ""  # type: ignore[attr-defined]
        if step.waiting:  # type: ignore[attr-defined]
            step.evidence = evidence(run, document.step(step.name).after)  # type: ignore[attr-defined]
            step.previews = scope_previews(run, document, step.name)  # type: ignore[attr-defined]
    # A puppet-run step that rolls out publishes its progress (batch k of n) while it waits.
    rolling = dict(
        StepRun.objects.filter(
            run=run, status=StepStatus.IN_PROGRESS, outputs__has_key="rollout"
        ).values_list("name", "outputs__rollout")
    )
    for step in steps:
        step.rollout = rolling.get(step.name)  # type: ignore[attr-defined]
    shown = {step.name: (step.status, step.duration) for step in steps}  # type: ignore[attr-defined]
    complete = run.status == RunStatus.COMPLETE
    return {
        "version": version,
        "run": run,
        "status_word": run_status(run),
        "duration": duration(run.started_at, run.ended_at) if run.ended_at else "",
        "started_by": started_by(run),
        "steps": steps,
        "svg": graph.workflow_svg(document, shown),
        "complete": complete,
        "may_approve": may_approve,
        "may_cancel": may_cancel and not complete,
    }


def _rights(request: HttpRequest, run: WorkflowRun) -> tuple[bool, bool]:
    """Whether the user may answer the run's approvals, and cancel it."""
    return may(request.user, Action.APPROVE, run.workflow), may(request.user, Action.CANCEL, run.workflow)


@login_required
def run_detail(request: HttpRequest, run_id: Any) -> HttpResponse:
    run = _run(request, run_id)
    rights = _rights(request, run)
    context = _run_context(run, versions.current_version(run.pk), *rights)
    context["ticket"] = versions.ticket_for(request, run, *rights)
    context["number"] = WorkflowRun.objects.filter(workflow_id=run.workflow_id).filter(not_after(run)).count()
    context["may_delete"] = context["complete"] and may(request.user, Action.DELETE_RUNS, run.workflow)
    return render(request, "pages/run_detail.html", context)


@login_required
def run_live(request: HttpRequest, run_id: Any) -> HttpResponse:
    """The run page's changing part, which the page asks for again and again until the run
    ends, with the version it shows: 204 while that is the run's (htmx then leaves the page
    alone, and the focus where it was). Under the ASGI server the ask has waited for a change
    before it comes here, and comes here only when its ticket would not do (pages.live)."""
    run = _run(request, run_id)
    version = versions.current_version(run.pk)
    if request.headers.get("X-Live-Version") == version:
        return HttpResponse(status=204, headers={"Cache-Control": "no-store"})
    rights = _rights(request, run)
    context = {**_run_context(run, version, *rights), "oob": True}
    context["ticket"] = versions.ticket_for(request, run, *rights)
    return render(request, "pages/_run_live.html", context)


def live_part(run_id: Any, version: str, may_approve: bool, may_cancel: bool) -> str | None:
    """The live part for every page of the run whose ticket gives these rights (pages.live
    renders it once per change, without a request): no CSRF token in its forms (the page
    adds its own: pages/static/pages/run.js), and a placeholder where each page's ticket goes.
    None when the run is gone."""
    runs = WorkflowRun.objects.select_related("workflow__owner", "revision", "created_by")
    run = runs.filter(pk=run_id).first()
    if run is None:
        return None
    context = {
        **_run_context(run, version, may_approve, may_cancel),
        "oob": True,
        "ticket": versions.TICKET_PLACEHOLDER,
    }
    return render_to_string("pages/_run_live.html", context)


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


# Why a step ended as it did, in words before its message.
ENDINGS = {
    StepStatus.SKIPPED: "Skipped",
    StepStatus.FAILURE: "Failed",
    StepStatus.SYSTEM_ERROR: "Could not be run",
    StepStatus.CANCELLED: "Cancelled",
}


@login_required
def run_step(request: HttpRequest, run_id: Any, step: str) -> HttpResponse:
    """A step's part of the run page, asked for when the step is opened (and again when its
    status changes while open): why it ended as it did, its outputs (sensitive ones masked),
    its spec as evaluated (what it read of secrets and connections masked), and the Puppet
    run it started."""
    run = _run(request, run_id)
    step_run = get_object_or_404(StepRun.objects.select_related("run"), run=run, name=step)
    spec, spec_problem = engine.shown_spec(step_run)
    puppet = puppet_run_of(step_run)
    return render(
        request,
        "pages/_step_detail.html",
        {
            "run": run,
            "step": step_run,
            "ending": ENDINGS.get(step_run.status, ""),  # type: ignore[call-overload]
            "when": engine.parsed(run.revision_id).step(step).when is not None,
            "outputs": json.dumps(step_run.shown_outputs, indent=2, sort_keys=True)
            if step_run.outputs
            else "",
            "spec": json.dumps(spec, indent=2, sort_keys=True, default=str) if spec is not None else "",
            "spec_problem": spec_problem,
            "puppet": puppet,
            "would_change": what_would_change(step_run.shown_outputs) if puppet is not None else "",
        },
    )


def deleted_with(run: WorkflowRun) -> list[tuple[str, int]]:
    """What deleting `run` deletes, as (what, how many): its steps, their logs, credentials…"""
    collector = NestedObjects(using=router.db_for_write(WorkflowRun))
    collector.collect([run])
    return sorted(
        (str(model._meta.verbose_name_plural), len(rows))
        for model, rows in collector.data.items()
        if model is not WorkflowRun
    )


@login_required
def delete_run(request: HttpRequest, run_id: Any) -> HttpResponse:
    """A complete run deleted, after a page that says what goes with it; for those who may
    delete the workflow's runs (workflows.permissions: its owner, or delete_workflowrun)."""
    run = _run(request, run_id)
    if not may(request.user, Action.DELETE_RUNS, run.workflow):
        raise PermissionDenied("Deleting runs needs the permission to (workflows.delete_workflowrun).")
    if run.status != RunStatus.COMPLETE:
        messages.error(request, "The run is not complete: cancel it first, then delete it.")
        return redirect("pages:run", run_id=run.pk)
    if request.method == "POST":
        number = WorkflowRun.objects.filter(workflow_id=run.workflow_id).filter(not_after(run)).count()
        run.delete()
        messages.success(request, f"Deleted: {run.workflow.name} #{number}, with its steps.")
        return redirect("pages:workflow", workflow_id=run.workflow_id)
    return render(request, "pages/run_delete.html", {"run": run, "deleted_with": deleted_with(run)})
