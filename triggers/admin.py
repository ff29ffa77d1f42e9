from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from relay.admin import TokenHolderAdmin
from triggers import setup
from triggers.models import Event, Trigger, TriggerKind
from triggers.permissions import Action, events_for, may, may_events, triggers_for


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
        "sender_settings",
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

    # Permissions: triggers.permissions, as in the API. Every staff user has the module and
    # the list (of what they may see); each row says what may be done to it. A change page of
    # another user's trigger is read-only to staff; its regenerate page (TokenHolderAdmin) is
    # refused them, as is its delete without the delete permission, in the list's action too
    # (the admin asks has_delete_permission of each row it would delete).

    @admin.display(description="Sender's settings")
    def sender_settings(self, trigger: Trigger) -> str:
        """What the sender is set up with, ready to paste, naming the token (never showing it)."""
        if trigger.kind == TriggerKind.WEBHOOK:
            return format_html('<pre class="trigger-setup">{}</pre>', setup.webhook_curl(trigger))
        return format_html(
            "<p>puppetlabs-relay's report processor (the token in a file):</p>"
            '<pre class="trigger-setup">{}</pre>'
            "<p>or Puppet's own http processor, which puts the token in the URL, and puppetserver logs that "
            "URL whenever the service answers anything but 2xx:</p>"
            '<pre class="trigger-setup">{}</pre>',
            setup.report_processor_settings(trigger),
            setup.http_processor_settings(trigger),
        )

    def get_queryset(self, request: HttpRequest) -> QuerySet[Trigger]:
        return triggers_for(request.user, super().get_queryset(request).select_related("workflow"))

    def has_module_permission(self, request: HttpRequest) -> bool:
        return request.user.is_active and request.user.is_staff

    def has_view_permission(self, request: HttpRequest, obj: Trigger | None = None) -> bool:
        return obj is None or may(request.user, Action.VIEW, obj)

    def has_change_permission(self, request: HttpRequest, obj: Trigger | None = None) -> bool:
        return obj is None or may(request.user, Action.CHANGE, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Trigger | None = None) -> bool:
        return obj is None or may(request.user, Action.DELETE, obj)

    def get_readonly_fields(self, request: HttpRequest, obj: Trigger | None = None) -> list[str]:
        fields = super().get_readonly_fields(request, obj)
        return [*fields, "name"] if obj is not None and obj.workflow_id else fields

    def get_deleted_objects(self, objs: QuerySet | list[Trigger], request: HttpRequest) -> tuple:
        """As the API's delete: a trigger's events go with it for whoever may delete the
        trigger, not by the events' own permissions; each trigger is asked of `may` (the
        list's action gets a queryset of many)."""
        deleted, counts, _, protected = super().get_deleted_objects(objs, request)
        refused = [t for t in objs if not self.has_delete_permission(request, t)]
        return deleted, counts, {self.opts.verbose_name} if refused else set(), protected


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    """Events as received, read-only. Who sees and deletes them is triggers.permissions, as in
    the API: a trigger's owner their own here whatever their permissions; other users' with
    the events' view and delete permissions."""

    list_display = ["received_at", "trigger", "state", "host", "status", "body_format", "body_size"]
    # Only the triggers of the events listed: the plain filter would list every trigger's name.
    list_filter = ["state", "status", "body_format", ("trigger", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["id", "host", "transaction_uuid", "key", "body_sha256"]
    list_select_related = ["trigger"]
    date_hierarchy = "received_at"

    def get_readonly_fields(self, request: HttpRequest, obj: Event | None = None) -> list[str]:
        return ["report_summary", *(field.name for field in Event._meta.fields)]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Event]:
        return events_for(request.user, super().get_queryset(request).select_related("trigger"))

    def has_module_permission(self, request: HttpRequest) -> bool:
        return request.user.is_active and request.user.is_staff

    def has_view_permission(self, request: HttpRequest, obj: Event | None = None) -> bool:
        return obj is None or may_events(request.user, Action.VIEW, obj.trigger)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Event | None = None) -> bool:
        return False  # a report as received

    def has_delete_permission(self, request: HttpRequest, obj: Event | None = None) -> bool:
        return obj is None or may_events(request.user, Action.DELETE, obj.trigger)

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
