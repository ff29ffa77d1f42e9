from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from relay.admin import TokenHolderAdmin
from triggers.models import Event, Trigger
from workflows.permissions import Action, may


@admin.register(Trigger)
class TriggerAdmin(TokenHolderAdmin):
    """Triggers of their own and workflows' (named and deleted by the workflow's document)."""

    list_display = [
        "name",
        "kind",
        "owner",
        "workflow",
        "token_prefix",
        "has_slack_webhook",
        "created",
        "last_used",
        "token_regenerated_at",
    ]
    list_filter = ["kind", "has_slack_webhook", "created", "last_used"]
    readonly_fields = [
        "id",
        "kind",
        "image",
        "workflow",
        "token_prefix",
        "has_slack_webhook",
        "created",
        "last_used",
        "token_regenerated_at",
    ]
    editable_fields = (
        *TokenHolderAdmin.editable_fields,
        "statuses",
        "environments",
        "host_globs",
        "resource_types",
        "title_globs",
        "tags",
    )
    token_hint = (
        "Use it as the password in Puppet's reporturl (https://any:TOKEN@host/api/events), "
        "or as a Bearer token."
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).select_related("workflow")

    def get_readonly_fields(self, request: HttpRequest, obj: Trigger | None = None) -> list[str]:
        fields = super().get_readonly_fields(request, obj)
        return [*fields, "name"] if obj is not None and obj.workflow_id else fields

    # A workflow's trigger starts runs as the workflow's owner: its filters and token are the
    # owner's and superusers' alone, as its document is (workflows.permissions), whatever
    # permissions on triggers other staff hold; its owner sees and changes it here.

    def has_view_permission(self, request: HttpRequest, obj: Trigger | None = None) -> bool:
        if obj is not None and obj.workflow_id and may(request.user, Action.CHANGE, obj.workflow):
            return True
        return super().has_view_permission(request, obj)

    def has_change_permission(self, request: HttpRequest, obj: Trigger | None = None) -> bool:
        if obj is not None and obj.workflow_id:
            return may(request.user, Action.CHANGE, obj.workflow)
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Trigger | None = None) -> bool:
        # A workflow's trigger goes when a revision of the workflow no longer declares it.
        if obj is not None and obj.workflow_id:
            return False
        return super().has_delete_permission(request, obj)


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ["received_at", "trigger", "state", "host", "status", "body_format", "body_size"]
    list_filter = ["state", "status", "body_format", "trigger"]
    search_fields = ["id", "host", "transaction_uuid", "key", "body_sha256"]
    list_select_related = ["trigger"]
    date_hierarchy = "received_at"

    def get_readonly_fields(self, request: HttpRequest, obj: Event | None = None) -> list[str]:
        return ["report_summary", *(field.name for field in Event._meta.fields)]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.display(description="Summary")
    def report_summary(self, event: Event) -> str:
        summary = event.summary
        if not summary:
            return event.failure_reason or "Not read yet."
        head = format_html(
            "<p><strong>{}</strong>: {} in {} at {} (Puppet {}{})</p>",
            summary["host"],
            summary["status"],
            summary.get("environment") or "?",
            summary.get("time") or "?",
            summary.get("puppet_version") or "?",
            ", noop" if summary.get("noop") else "",
        )
        rows = format_html_join(
            "",
            "<li>{}[{}]: {} change(s){}</li>",
            (
                (r["type"], r["title"], r["change_count"], " FAILED" if r["failed"] else "")
                for r in summary.get("resources", [])[:50]
            ),
        )
        more = summary.get("resources_total", 0) - min(50, len(summary.get("resources", [])))
        tail = format_html("<p>and {} more</p>", more) if more > 0 else ""
        return format_html("{}<ul>{}</ul>{}", head, rows, tail)
