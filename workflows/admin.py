from django.contrib import admin
from django.http import HttpRequest

from workflows.models import Workflow, WorkflowRevision


class RevisionInline(admin.TabularInline):
    """Revisions are the history of the document: shown, never edited."""

    model = WorkflowRevision
    fields = ["number", "created_by", "created_at", "source"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ["-number"]

    def has_add_permission(self, request: HttpRequest, obj: Workflow | None = None) -> bool:
        return False


@admin.register(Workflow)
class WorkflowAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "updated"]
    search_fields = ["name", "owner__username"]
    readonly_fields = ["created", "updated"]
    inlines = [RevisionInline]
