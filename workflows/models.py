import uuid

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from connections.models import name_validator
from workflows.dialect import validate
from workflows.dialect.workflow import Workflow as ParsedWorkflow


class Workflow(models.Model):
    """A user's workflow: a name, and the revisions of its document (the newest is current)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="workflows")
    name = models.CharField(max_length=64, validators=[name_validator])
    description = models.TextField(blank=True, max_length=2000)
    created = models.DateTimeField(default=timezone.now, editable=False)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["owner_id", "name"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="unique_workflow_name_per_owner")
        ]

    def __str__(self) -> str:
        return self.name

    def latest_revision(self) -> "WorkflowRevision | None":
        return self.revisions.order_by("-number").first()

    def add_revision(self, source: str, user: object | None) -> "WorkflowRevision":
        """Saves `source`, verbatim, as the next revision. Raises DocumentError (with the
        problems and their places) when it is not a valid workflow."""
        validate.parse(source)
        with transaction.atomic():
            # The row lock serialises two saves of one workflow, so their numbers differ.
            Workflow.objects.select_for_update().filter(pk=self.pk).update(updated=timezone.now())
            last = self.revisions.aggregate(last=models.Max("number"))["last"] or 0
            return self.revisions.create(number=last + 1, source=source, created_by=user)


class WorkflowRevision(models.Model):
    """One saved version of a workflow document, exactly as its author wrote it. Runs pin the
    revision they started from."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="revisions")
    number = models.PositiveIntegerField(editable=False)
    source = models.TextField(editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        editable=False,
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["workflow_id", "number"]
        constraints = [
            models.UniqueConstraint(fields=["workflow", "number"], name="unique_revision_number_per_workflow")
        ]

    def __str__(self) -> str:
        return f"{self.workflow.name} #{self.number}"

    def parsed(self) -> ParsedWorkflow:
        """The document as the engine uses it (it was valid when saved)."""
        return validate.parse(self.source)
