from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from runs.models import Conflict, Rollout, Run, RunTransition


class RunTransitionInline(admin.TabularInline):
    model = RunTransition
    fields = ["at", "from_status", "to_status", "token_prefix", "note"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Run | None = None) -> bool:
        return False


class RolloutInline(admin.StackedInline):
    """A rollout's own run shows where the rollout is; its batches are runs of their own."""

    model = Rollout
    fields = [
        "state",
        "current",
        "nodes_done",
        "nodes_failed",
        "max_failures",
        "canary",
        "batch_size",
        "pause",
        "next_batch_at",
        "stop_reason",
    ]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Run | None = None) -> bool:
        return False


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    """Staff see every run; runs are made by the API, so the admin only reads and cancels."""

    list_display = [
        "id",
        "type",
        "connection",
        "status",
        "outcome",
        "environment",
        "created_at",
        "updated_at",
    ]
    list_filter = [
        "status",
        "outcome",
        "type",
        "is_rollout",
        "connection__platform",
        "created_at",
        "connection",
    ]
    search_fields = ["id", "connection__name", "environment", "job_id", "name"]
    list_select_related = ["connection"]
    date_hierarchy = "created_at"
    inlines = [RolloutInline, RunTransitionInline]
    actions = ["cancel_runs"]

    def get_readonly_fields(self, request: HttpRequest, obj: Run | None = None) -> list[str]:
        return [field.name for field in Run._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Cancel the selected runs", permissions=["change"])
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        done, refused = 0, 0
        for run in queryset:
            try:
                run.cancel(f"staff:{request.user.get_username()}")
                done += 1
            except Conflict:
                refused += 1
        self.message_user(request, f"Cancelled or asked to stop: {done}.")
        if refused:
            self.message_user(request, f"Already complete, left alone: {refused}.", messages.WARNING)
