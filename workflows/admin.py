"""Workflows (the document edited in place, its errors under it), their runs (steps with
statuses, timings and outputs, sensitive ones masked, the event that started them), and
approvals with their approve and reject buttons (for users with workflows.approve_steprun;
read-only to others).

Who may do what is workflows.permissions, as in the API: staff see and manage their own
workflows, runs and approvals here whatever their permissions; other users' need the
permissions it names, and their documents, secrets, triggers and owners are theirs (and
superusers') alone."""

import json
import uuid
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import formats, timezone
from django.utils.decorators import method_decorator
from django.utils.html import format_html, format_html_join
from django.views.decorators.debug import sensitive_post_parameters

from relay import vault
from runs.models import Run
from scriptsteps import services as scripts
from workflows import engine
from workflows.dialect.validate import parse, validate
from workflows.models import (
    Approval,
    Conflict,
    RunStatus,
    StepKind,
    StepRun,
    StepStatus,
    Workflow,
    WorkflowRevision,
    WorkflowRun,
    WorkflowSecret,
)
from workflows.permissions import Action, is_superuser, may, runs_for, steps_for, workflows_for
from workflows.previews import scope_previews


def puppet_run_of(step: StepRun) -> Run | None:
    """The Puppet run a Puppet step made or waits for (its `id` output), if it is one."""
    run_id = step.shown_outputs.get("id")  # a step's sensitive output links nowhere
    try:
        return Run.objects.filter(pk=uuid.UUID(str(run_id))).first() if run_id else None
    except ValueError:
        return None


def what_would_change(outputs: Any) -> str:
    """A run-wait's `results`, per node: whether changes are pending and which resources
    would change (the bridge reads them from each node's report of the run: from the node,
    or from PuppetDB), or why that is not known."""
    results = outputs.get("results") if isinstance(outputs, dict) else None
    nodes = results.get("nodes") if isinstance(results, dict) else None  # or hidden: MASK
    if not isinstance(nodes, list):
        return ""
    lines = []
    for node in nodes[:100]:
        if not isinstance(node, dict):
            continue
        pending = node.get("changes_pending")
        state = {True: "changes pending", False: "no changes pending"}.get(pending, "not known")
        if pending is None and isinstance(node.get("report_error"), str):
            state = node["report_error"]  # why not: e.g. "not available: <reason>" (PuppetDB)
        changes = [
            f"{r.get('type')}[{r.get('title')}] "
            + ", ".join(
                f"{c.get('property')}: {c.get('from')} → {c.get('to')}" for c in r.get("changes") or []
            )
            for r in node.get("resources") or []
            if isinstance(r, dict)
        ]
        lines.append((node.get("name"), state, "; ".join(changes)))
    return format_html_join("", "<p><strong>{}</strong>: {}<br>{}</p>", lines)


def pretty_json(value: Any) -> str:
    return format_html("<pre style='margin:0'>{}</pre>", json.dumps(value, indent=2, sort_keys=True))


# Workflows -----------------------------------------------------------------------------------


class WorkflowForm(forms.ModelForm):
    """The workflow with its document: saving a changed document saves a new revision. A
    document with errors is not saved; each error is listed under it with its line, column
    and JSON Pointer."""

    source = forms.CharField(
        label="Document",
        strip=False,
        widget=forms.Textarea(
            attrs={"rows": 30, "cols": 100, "style": "font-family: monospace", "spellcheck": "false"}
        ),
        help_text="The workflow in Relay's v1 YAML. Saving a changed document makes a new revision.",
    )

    class Meta:
        model = Workflow
        fields = ["owner", "name", "description"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        latest = self.instance.latest_revision() if self.instance.pk else None
        if latest is not None:
            self.fields["source"].initial = latest.source

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        # Names are unique per owner; when the owner is not a field of this form (a change by
        # anyone but a superuser), the form does not check the model's constraint: here.
        if "owner" not in self.fields and data.get("name"):
            taken = Workflow.objects.filter(owner=self.instance.owner_id, name=data["name"])
            if taken.exclude(pk=self.instance.pk).exists():
                self.add_error("name", "The owner already has a workflow with this name.")
        # The owner's budget of schedule triggers (Workflow.add_revision checks it again
        # under a lock): said on the form, not as an error page.
        owner_id = data["owner"].pk if data.get("owner") is not None else self.instance.owner_id
        source = data.get("source")
        if owner_id is not None and source is not None:
            workflow = self.instance
            had = workflow.schedule_names() if workflow.pk else set()
            for p in workflow.owner_schedule_problems(owner_id, source, parse(source), had):
                self.add_error("source", f"Line {p.line}, column {p.column} ({p.pointer}): {p.detail}")
        return data

    def clean_source(self) -> str:
        source = self.cleaned_data["source"]
        result = validate(source)
        if not result.valid:
            raise forms.ValidationError(
                [
                    f"Line {p.line}, column {p.column} ({p.pointer}): {p.detail}"
                    if p.line is not None
                    else f"{p.pointer}: {p.detail}"
                    for p in result.problems
                ]
            )
        return source


class SecretForm(forms.ModelForm):
    """A secret by name; its value is written to Vault and never shown (blank keeps it)."""

    value = forms.CharField(
        required=False,
        strip=False,
        max_length=WorkflowSecret.MAX_LENGTH,
        widget=forms.PasswordInput(render_value=False),
        help_text="Kept in Vault, never shown. Leave blank to keep the current value.",
    )

    class Meta:
        model = WorkflowSecret
        fields = ["name"]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if self.instance.pk and data.get("name") not in (None, self.instance.name):
            self.add_error("name", "A secret cannot be renamed: delete it and add another.")
        if not self.instance.pk and not data.get("value") and not data.get("DELETE"):
            self.add_error("value", "A new secret needs a value.")
        return data


class WorkflowPartInline(admin.TabularInline):
    """A part of the workflow (its secrets, its revisions): seen with it, and changed by
    whoever may change it (workflows.permissions), not by the part's own model permissions."""

    def has_view_permission(self, request: HttpRequest, obj: Workflow | None = None) -> bool:
        return obj is None or may(request.user, Action.VIEW, obj)

    def has_add_permission(self, request: HttpRequest, obj: Workflow | None = None) -> bool:
        return obj is None or may(request.user, Action.CHANGE, obj)

    def has_change_permission(self, request: HttpRequest, obj: Workflow | None = None) -> bool:
        return obj is None or may(request.user, Action.CHANGE, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Workflow | None = None) -> bool:
        return obj is None or may(request.user, Action.CHANGE, obj)


class SecretInline(WorkflowPartInline):
    model = WorkflowSecret
    form = SecretForm
    fields = ["name", "value", "updated_at", "updated_by"]
    readonly_fields = ["updated_at", "updated_by"]
    extra = 0


class RevisionInline(WorkflowPartInline):
    """Revisions are the history of the document: shown, never edited."""

    model = WorkflowRevision
    fields = ["number", "created_by", "created_at", "document"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ["-number"]

    def has_add_permission(self, request: HttpRequest, obj: Workflow | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Workflow | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Workflow | None = None) -> bool:
        return False

    @admin.display(description="document")
    def document(self, revision: WorkflowRevision) -> str:
        """As written: the admin's read-only text field would join its lines with <br> and lose
        the indentation, which is YAML's structure."""
        return format_html('<pre class="revision-source" style="margin:0">{}</pre>', revision.source)


@admin.register(Workflow)
class WorkflowAdmin(admin.ModelAdmin):
    form = WorkflowForm
    list_display = ["name", "owner", "updated"]
    search_fields = ["name", "owner__username"]
    readonly_fields = ["created", "updated"]
    autocomplete_fields = ["owner"]
    inlines = [SecretInline, RevisionInline]

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, str]:
        return {"owner": str(request.user.pk), **super().get_changeform_initial_data(request)}

    # Permissions: workflows.permissions. Every staff user has the module and the list (of
    # what they may see); each row says what may be done to it.

    def get_queryset(self, request: HttpRequest) -> QuerySet[Workflow]:
        return workflows_for(request.user, super().get_queryset(request))

    def has_module_permission(self, request: HttpRequest) -> bool:
        return request.user.is_active and request.user.is_staff

    def has_view_permission(self, request: HttpRequest, obj: Workflow | None = None) -> bool:
        return obj is None or may(request.user, Action.VIEW, obj)

    def has_change_permission(self, request: HttpRequest, obj: Workflow | None = None) -> bool:
        return obj is None or may(request.user, Action.CHANGE, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Workflow | None = None) -> bool:
        return obj is None or may(request.user, Action.DELETE, obj)

    def get_readonly_fields(self, request: HttpRequest, obj: Workflow | None = None) -> list[str]:
        # Only a superuser gives a workflow to someone else (Workflow.hand_over).
        fields = list(super().get_readonly_fields(request, obj))
        return fields if obj is None or is_superuser(request.user) else ["owner", *fields]

    def get_autocomplete_fields(self, request: HttpRequest) -> list[str]:
        return list(self.autocomplete_fields) if is_superuser(request.user) else []

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        # A new workflow is its maker's, unless a superuser says otherwise.
        if db_field.name == "owner" and not is_superuser(request.user):
            kwargs["queryset"] = get_user_model()._default_manager.filter(pk=request.user.pk)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> tuple:
        """As the API's delete: the workflow's runs, triggers and secrets go with it, for
        whoever may delete it (not by their own models' permissions), and never while one of
        its runs is not complete (those are shown as protected)."""
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        refused = [w for w in objs if not self.has_delete_permission(request, w)]
        perms_needed = {self.opts.verbose_name} if refused else set()
        busy = WorkflowRun.objects.filter(workflow__in=list(objs)).exclude(status=RunStatus.COMPLETE)
        protected = [*protected, *(f"Run {run.pk} ({run.status}): cancel it first" for run in busy)]
        return deleted, counts, perms_needed, protected

    def save_model(self, request: HttpRequest, obj: Workflow, form: WorkflowForm, change: bool) -> None:
        obj.save()
        if change and "owner" in form.changed_data:  # a superuser's (get_readonly_fields)
            obj.hand_over(obj.owner)
        latest = obj.latest_revision()
        source = form.cleaned_data["source"]
        if latest is None or latest.source != source:
            revision = obj.add_revision(source, request.user)
            # Their tokens are shown once, on the page that answers this POST (response_add,
            # response_change): never in a message, which a cookie would keep.
            request._relay_new_triggers = revision.new_triggers  # type: ignore[attr-defined]

    def response_add(
        self, request: HttpRequest, obj: Workflow, post_url_continue: str | None = None
    ) -> HttpResponse:
        made = getattr(request, "_relay_new_triggers", ())
        return (
            self._reveal(request, obj, made)
            if made
            else super().response_add(request, obj, post_url_continue)
        )

    def response_change(self, request: HttpRequest, obj: Workflow) -> HttpResponse:
        made = getattr(request, "_relay_new_triggers", ())
        return self._reveal(request, obj, made) if made else super().response_change(request, obj)

    def _reveal(self, request: HttpRequest, workflow: Workflow, made: tuple) -> HttpResponse:
        """The one page that shows the new triggers' first tokens (as a connection's is shown
        at its creation). It answers the POST, so there is no URL to come back to; no-store
        keeps it out of the browser's cache."""
        pks = dict(workflow.push_triggers.filter(name__in=[t.name for t in made]).values_list("name", "pk"))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "original": workflow,
            "title": "Copy the new triggers' tokens now",
            "triggers": [
                (trigger, reverse("admin:triggers_trigger_change", args=[pks[trigger.name]]))
                for trigger in made
                if trigger.name in pks
            ],
            "change_url": reverse("admin:workflows_workflow_change", args=[workflow.pk]),
            "page_url": reverse("pages:workflow", args=[workflow.pk]),  # each trigger's settings
        }
        response = TemplateResponse(request, "admin/workflows/new_trigger_tokens.html", context)
        response["Cache-Control"] = "no-store"
        return response

    def save_formset(self, request: HttpRequest, form: WorkflowForm, formset: Any, change: bool) -> None:
        if formset.model is not WorkflowSecret:
            super().save_formset(request, form, formset, change)
            return
        # Values go to Vault (WorkflowSecret.put), never through the form's model save. The
        # lists are what the admin's change message reads.
        formset.new_objects, formset.changed_objects, formset.deleted_objects = [], [], []
        for secret_form in formset.forms:
            data = getattr(secret_form, "cleaned_data", None) or {}
            if not data:
                continue
            if data.get("DELETE"):
                if secret_form.instance.pk:
                    secret_form.instance.delete()
                    formset.deleted_objects.append(secret_form.instance)
            elif data.get("value"):
                new = not secret_form.instance.pk
                secret = WorkflowSecret.put(form.instance, data["name"], data["value"], request.user)
                if new:
                    formset.new_objects.append(secret)
                else:
                    formset.changed_objects.append((secret, ["value"]))

    @method_decorator(sensitive_post_parameters())
    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict | None = None,
    ) -> HttpResponse:
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except vault.VaultUnavailable as exc:
            self.message_user(request, f"Nothing was saved. {exc}", messages.ERROR)
            return HttpResponseRedirect(request.path)


# Runs ----------------------------------------------------------------------------------------


class StepRunInline(admin.TabularInline):
    model = StepRun
    fields = [
        "name",
        "kind",
        "image",
        "status",
        "started_at",
        "ended_at",
        "took",
        "attempts",
        "shown_outputs",
        "puppet_run",
        "message",
    ]
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ["index"]

    @admin.display(description="Puppet run")
    def puppet_run(self, step: StepRun) -> str:
        run = puppet_run_of(step)
        if run is None:
            return ""
        url = reverse("admin:runs_run_change", args=[run.pk])
        return format_html('<a href="{}">{} ({})</a>', url, run.pk, run.status)

    def has_add_permission(self, request: HttpRequest, obj: WorkflowRun | None = None) -> bool:
        return False

    @admin.display(description="took")
    def took(self, step: StepRun) -> str:
        if step.started_at and step.ended_at:
            return f"{(step.ended_at - step.started_at).total_seconds():.3f} s"
        return ""

    @admin.display(description="outputs")
    def shown_outputs(self, step: StepRun) -> str:
        return pretty_json(step.shown_outputs) if step.outputs else ""


@admin.register(WorkflowRun)
class WorkflowRunAdmin(admin.ModelAdmin):
    """Runs are made by the API and triggers; the admin reads them and cancels them."""

    list_display = ["id", "workflow", "status", "outcome", "created_at", "ended_at", "started_by_event"]
    list_filter = ["status", "outcome", "created_at"]
    list_select_related = ["workflow", "event"]
    search_fields = ["id", "workflow__name", "workflow__owner__username"]
    date_hierarchy = "created_at"
    inlines = [StepRunInline]
    actions = ["cancel_runs"]
    fields = [
        "id",
        "workflow",
        "revision",
        "status",
        "outcome",
        "message",
        "shown_parameters",
        "started_by_event",
        "created_by",
        "created_at",
        "started_at",
        "ended_at",
        "cancel_requested",
        "script_logs",
    ]
    readonly_fields = fields

    class Media:
        js = ["scriptsteps/log-tail.js"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    # Permissions: workflows.permissions, as the workflows' above.

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkflowRun]:
        return runs_for(request.user, super().get_queryset(request))

    def has_module_permission(self, request: HttpRequest) -> bool:
        return request.user.is_active and request.user.is_staff

    def has_view_permission(self, request: HttpRequest, obj: WorkflowRun | None = None) -> bool:
        return obj is None or may(request.user, Action.VIEW_RUNS, obj.workflow)

    def has_change_permission(self, request: HttpRequest, obj: WorkflowRun | None = None) -> bool:
        # The only change is a cancel (the action, which checks each run): a run's page is
        # read-only, and a complete run's has nothing left to change at all.
        if obj is not None and obj.status == RunStatus.COMPLETE:
            return False
        return obj is None or may(request.user, Action.CANCEL, obj.workflow)

    def has_delete_permission(self, request: HttpRequest, obj: WorkflowRun | None = None) -> bool:
        # One complete run at a time, from its page, for whoever may delete the workflow's
        # runs (as the pages' Delete): no bulk action, which would take runs still going.
        if obj is None or obj.status != RunStatus.COMPLETE:
            return False
        return may(request.user, Action.DELETE_RUNS, obj.workflow)

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> tuple:
        """Its steps, their logs and credentials go with it, by the run's permission (not by
        their own models')."""
        deleted, counts, _, protected = super().get_deleted_objects(objs, request)
        refused = [run for run in objs if not self.has_delete_permission(request, run)]
        return deleted, counts, {self.opts.verbose_name} if refused else set(), protected

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict | None = None
    ) -> HttpResponse:
        # Every field is read-only: there is never anything to save (cancel is an action). A
        # POST would save the row as this request read it, undoing a worker's change since.
        if request.method == "POST":
            return HttpResponseNotAllowed(["GET"])
        extra_context = {**(extra_context or {}), "show_save": False, "show_save_and_continue": False}
        return super().change_view(request, object_id, form_url, extra_context)

    @admin.display(description="script logs")
    def script_logs(self, run: WorkflowRun) -> str:
        """Each script step's log tail, which grows on the page while the step runs."""
        blocks = []
        for step in run.steps.filter(script__isnull=False).order_by("index"):
            log = scripts.read_log(step, 0, scripts.ADMIN_TAIL + 1)
            if log["length"] > scripts.ADMIN_TAIL:
                log = scripts.read_log(step, log["length"] - scripts.ADMIN_TAIL, scripts.ADMIN_TAIL)
            url = reverse("workflow-run-step-log", args=[run.pk, step.name])
            blocks.append(
                format_html(
                    '<div><strong>{}</strong> <span class="log-status">{}</span>'
                    '<pre style="max-height: 30em; overflow: auto; white-space: pre-wrap" '
                    'data-log-url="{}" data-offset="{}"{}>{}</pre></div>',
                    step.name,
                    step.status,
                    url,
                    log["next_offset"],
                    "" if log["complete"] else " data-follow",
                    log["text"],
                )
            )
        return format_html_join("", "{}", ((block,) for block in blocks)) if blocks else "—"

    @admin.display(description="parameters")
    def shown_parameters(self, run: WorkflowRun) -> str:
        return pretty_json(run.parameters)

    @admin.display(description="event")
    def started_by_event(self, run: WorkflowRun) -> str:
        if run.event_id is None:
            return "—"
        url = reverse("admin:triggers_event_change", args=[run.event_id])
        return format_html('<a href="{}">{}</a>', url, run.event)

    @admin.action(description="Cancel the selected runs", permissions=["change"])
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> None:
        done, refused = 0, 0
        runs = list(queryset.select_related("workflow"))
        denied = [run for run in runs if not may(request.user, Action.CANCEL, run.workflow)]
        if denied:
            self.message_user(
                request,
                f"You may not cancel runs of another user's workflow: nothing was cancelled ({len(denied)}).",
                messages.ERROR,
            )
            return
        for run in runs:
            try:
                engine.cancel_run(run)
                done += 1
            except Conflict:
                refused += 1
        self.message_user(request, f"Cancelled: {done}.")
        if refused:
            self.message_user(request, f"Already complete, left alone: {refused}.", messages.WARNING)


# Approvals -----------------------------------------------------------------------------------


@admin.register(Approval)
class ApprovalAdmin(admin.ModelAdmin):
    """Approval steps, waiting ones first. Users with workflows.approve_steprun answer them
    with the buttons on each page; others see them read-only."""

    change_form_template = "admin/workflows/approval_change_form.html"
    list_display = [
        "name",
        "workflow",
        "run_link",
        "status",
        "decision",
        "started_at",
        "deadline",
        "decided_by",
    ]
    list_filter = ["status", "decision"]
    list_select_related = ["run__workflow", "decided_by"]
    search_fields = ["name", "run__workflow__name", "run__id"]
    fields = [
        "name",
        "run_link",
        "workflow",
        "status",
        "started_at",
        "deadline",
        "evidence",
        "scope_preview",
        "decision",
        "decided_by",
        "decided_at",
        "message",
    ]
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[StepRun]:
        approvals = super().get_queryset(request).filter(kind=StepKind.APPROVAL)
        return steps_for(request.user, approvals).order_by("status", "-started_at")

    # Permissions: workflows.permissions. An approval is a step of a run: whoever sees the run
    # sees it (its evidence is the run's outputs); answering needs approve_steprun as well.

    def has_view_permission(self, request: HttpRequest, obj: StepRun | None = None) -> bool:
        return obj is None or may(request.user, Action.VIEW_RUNS, obj.run.workflow)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return request.user.is_active and request.user.is_staff

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: StepRun | None = None) -> bool:
        return False  # an answer is the only change, through its buttons

    def has_delete_permission(self, request: HttpRequest, obj: StepRun | None = None) -> bool:
        return False

    @admin.display(description="workflow")
    def workflow(self, step: StepRun) -> str:
        return step.run.workflow.name

    @admin.display(description="run")
    def run_link(self, step: StepRun) -> str:
        url = reverse("admin:workflows_workflowrun_change", args=[step.run_id])
        return format_html('<a href="{}">{}</a>', url, step.run_id)

    @admin.display(description="answer by")
    def deadline(self, step: StepRun) -> str:
        # Formatted here: a read-only field shows what a method returns as str() would.
        if step.status != StepStatus.IN_PROGRESS or step.recheck_at is None:
            return "—"
        return formats.localize(timezone.template_localtime(step.recheck_at))

    @admin.display(description="what it approves")
    def evidence(self, step: StepRun) -> str:
        """The outputs of the steps before it (a dry run's results), for the approver."""
        before = engine.parsed(step.run.revision_id).step(step.name).after
        rows = StepRun.objects.filter(run_id=step.run_id, name__in=before).order_by("index")
        if not rows:
            return "—"
        return format_html_join(
            "",
            "<p><strong>{}</strong> ({}): {}</p>{}{}",
            (
                (row.name, row.status, row.message, what_would_change(shown), pretty_json(shown))
                for row, shown in ((row, row.shown_outputs) for row in rows)
            ),
        )

    @admin.display(description="nodes it would run on")
    def scope_preview(self, step: StepRun) -> str:
        """Each puppet-run step after it: the nodes its scope names, as the connection's
        inventory knows them (unknown, stale, deactivated, expired), as the run page shows."""
        previews = scope_previews(step.run, engine.parsed(step.run.revision_id), step.name)
        if not previews:
            return "—"
        return render_to_string("workflows/_scope_preview.html", {"previews": previews})

    def render_change_form(
        self, request: HttpRequest, context: dict, *args: Any, **kwargs: Any
    ) -> HttpResponse:
        step = context.get("original")
        context["can_answer"] = bool(
            step is not None
            and step.status == StepStatus.IN_PROGRESS
            and may(request.user, Action.APPROVE, step.run.workflow)
        )
        return super().render_change_form(request, context, *args, **kwargs)

    def get_urls(self) -> list:
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path(
                "<uuid:object_id>/approve/",
                self.admin_site.admin_view(self.approve_view),
                name=f"{info}_approve",
            ),
            path(
                "<uuid:object_id>/reject/",
                self.admin_site.admin_view(self.reject_view),
                name=f"{info}_reject",
            ),
            *super().get_urls(),
        ]

    def approve_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._answer(request, object_id, approve=True)

    def reject_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._answer(request, object_id, approve=False)

    def _answer(self, request: HttpRequest, object_id: str, approve: bool) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        step = get_object_or_404(self.get_queryset(request).select_related("run__workflow"), pk=object_id)
        if not may(request.user, Action.APPROVE, step.run.workflow):
            return HttpResponse("Answering approvals needs the permission to approve them.", status=403)
        try:
            engine.answer(step, request.user, approve)
        except Conflict as exc:
            self.message_user(request, str(exc), messages.ERROR)
        else:
            self.message_user(request, f"{'Approved' if approve else 'Rejected'}: {step.name}.")
            self.log_change(request, step, "Approved." if approve else "Rejected.")
        url = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_change", args=[step.pk])
        return HttpResponseRedirect(url)
