from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from connections.models import name_validator
from relay.api.serializers import JSONObjectField, RejectUnknownFields, StrictCharField
from triggers.models import Schedule, Trigger, TriggerKind
from workflows.dialect.yamlload import MAX_BYTES
from workflows.models import StepRun, Workflow, WorkflowRevision, WorkflowRun, WorkflowSecret


class DocumentErrorSerializer(serializers.Serializer):
    """One problem in a workflow document (for the schema; the views answer plain dicts)."""

    pointer = serializers.CharField(help_text="JSON Pointer into the document, e.g. #/steps/0/image")
    line = serializers.IntegerField(allow_null=True, help_text="1-based line of that node")
    column = serializers.IntegerField(allow_null=True, help_text="1-based column of that node")
    detail = serializers.CharField()


class SourceField(StrictCharField):
    """A workflow document: YAML text, kept exactly as written."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(trim_whitespace=False, help_text="The workflow document (YAML text).", **kwargs)

    def to_internal_value(self, data: Any) -> str:
        text = super().to_internal_value(data)
        if len(text.encode()) > MAX_BYTES:
            raise serializers.ValidationError(
                f"A workflow document is at most {MAX_BYTES} bytes.", "too_large"
            )
        return text


class WorkflowCreateSerializer(RejectUnknownFields, serializers.Serializer):
    name = StrictCharField(max_length=64, validators=[name_validator])
    description = StrictCharField(max_length=2000, required=False, allow_blank=True, default="")
    source = SourceField()


class WorkflowUpdateSerializer(RejectUnknownFields, serializers.Serializer):
    source = SourceField()
    description = StrictCharField(max_length=2000, required=False, allow_blank=True)


class PushTriggerTokenSerializer(serializers.Serializer):
    name = serializers.CharField()
    type = serializers.ChoiceField(["push", "webhook"])
    token = serializers.CharField(help_text="Shown once, in the answer that made the trigger.")
    url = serializers.URLField(required=False, help_text="A webhook trigger's: where its events go.")


class PushTriggerSerializer(serializers.Serializer):
    name = serializers.CharField()
    id = serializers.UUIDField()
    token_prefix = serializers.CharField()


class WebhookTriggerSerializer(PushTriggerSerializer):
    url = serializers.URLField(help_text="Where its events go (POST a JSON object, with its token).")
    image = serializers.CharField()
    passes_through = serializers.BooleanField(
        help_text="Whether its image passes the JSON body through as the event (the only images "
        "this service stands in for); if not, its URL refuses events with a 409."
    )


class ScheduleTriggerSerializer(serializers.Serializer):
    name = serializers.CharField()
    schedule = serializers.CharField()
    next_due = serializers.DateTimeField()
    last_due = serializers.DateTimeField(allow_null=True)
    last_note = serializers.CharField(help_text="What became of the last slot: its run, or why none.")


class WorkflowSerializer(serializers.ModelSerializer):
    """A workflow with its newest document, and its secrets' names (never their values)."""

    owner = serializers.CharField(source="owner.get_username", read_only=True)
    revision = serializers.SerializerMethodField()
    source = serializers.SerializerMethodField()
    secrets = serializers.SerializerMethodField()
    triggers = serializers.SerializerMethodField()
    push_triggers = serializers.SerializerMethodField(
        help_text="Its push triggers (at /api/triggers/{id}/: their filters, Slack webhook, events)."
    )
    webhook_triggers = serializers.SerializerMethodField(
        help_text="Its webhook triggers (their events at /api/triggers/{id}/events/)."
    )
    schedule_triggers = serializers.SerializerMethodField(help_text="Its schedule triggers, times in UTC.")

    class Meta:
        model = Workflow
        fields = [
            "id",
            "name",
            "description",
            "owner",
            "created",
            "updated",
            "revision",
            "source",
            "secrets",
            "triggers",
            "push_triggers",
            "webhook_triggers",
            "schedule_triggers",
        ]

    def _latest(self, workflow: Workflow) -> WorkflowRevision | None:
        cache = self.context.setdefault("latest", {})
        if workflow.pk not in cache:
            cache[workflow.pk] = workflow.latest_revision()
        return cache[workflow.pk]

    def get_revision(self, workflow: Workflow) -> int | None:
        latest = self._latest(workflow)
        return latest.number if latest else None

    def get_source(self, workflow: Workflow) -> str | None:
        latest = self._latest(workflow)
        return latest.source if latest else None

    @extend_schema_field(PushTriggerTokenSerializer(many=True))
    def get_triggers(self, workflow: Workflow) -> list[dict[str, str]]:
        """The push and webhook triggers the document's `triggers:` made in this request (a
        create, or a revision that names new ones), each with its token, shown this once:
        the views put the revision's `new_triggers` in the context."""
        return [trigger.as_dict() for trigger in self.context.get("new_triggers", ())]

    @extend_schema_field(PushTriggerSerializer(many=True))
    def get_push_triggers(self, workflow: Workflow) -> list[dict[str, str]]:
        return [
            {"name": trigger.name, "id": str(trigger.pk), "token_prefix": trigger.token_prefix}
            for trigger in Trigger.objects.filter(workflow=workflow, kind=TriggerKind.PUSH).order_by("name")
        ]

    @extend_schema_field(WebhookTriggerSerializer(many=True))
    def get_webhook_triggers(self, workflow: Workflow) -> list[dict[str, Any]]:
        return [
            {
                "name": trigger.name,
                "id": str(trigger.pk),
                "token_prefix": trigger.token_prefix,
                "url": trigger.webhook_url(),
                "image": trigger.image,
                "passes_through": trigger.passes_through,
            }
            for trigger in Trigger.objects.filter(workflow=workflow, kind=TriggerKind.WEBHOOK).order_by(
                "name"
            )
        ]

    @extend_schema_field(ScheduleTriggerSerializer(many=True))
    def get_schedule_triggers(self, workflow: Workflow) -> list[dict[str, Any]]:
        return ScheduleTriggerSerializer(
            Schedule.objects.filter(workflow=workflow).order_by("name"), many=True
        ).data

    def get_secrets(self, workflow: Workflow) -> list[str]:
        return [secret.name for secret in WorkflowSecret.objects.filter(workflow=workflow)]


class RevisionSerializer(serializers.ModelSerializer):
    created_by = serializers.CharField(source="created_by.get_username", read_only=True, default=None)

    class Meta:
        model = WorkflowRevision
        fields = ["number", "created_by", "created_at", "source"]


class WorkflowRunCreateSerializer(RejectUnknownFields, serializers.Serializer):
    parameters = JSONObjectField(required=False, default=dict, help_text="Name → value.")


class StepRunSerializer(serializers.ModelSerializer):
    decided_by = serializers.CharField(source="decided_by.get_username", read_only=True, default=None)
    outputs = serializers.JSONField(
        source="shown_outputs",
        read_only=True,
        help_text='Name → value; a sensitive output (`ni output set --sensitive`) shows as "***", '
        "and so does every output a script step set itself until that step has ended.",
    )

    class Meta:
        model = StepRun
        fields = [
            "name",
            "kind",
            "image",
            "status",
            "outputs",
            "decorators",
            "started_at",
            "ended_at",
            "message",
            "decision",
            "decided_by",
            "decided_at",
        ]


class StepRunSummarySerializer(StepRunSerializer):
    """A step in a list of runs: without its outputs and decorators, which a step may make
    megabytes of (STEP_OUTPUTS_MAX_BYTES); the run's own page has them."""

    class Meta(StepRunSerializer.Meta):
        fields = [f for f in StepRunSerializer.Meta.fields if f not in ("outputs", "decorators")]


class WorkflowRunSerializer(serializers.ModelSerializer):
    workflow = serializers.CharField(source="workflow.name", read_only=True)
    owner = serializers.CharField(source="workflow.owner.get_username", read_only=True)
    revision = serializers.IntegerField(source="revision.number", read_only=True)
    created_by = serializers.CharField(source="created_by.get_username", read_only=True, default=None)
    steps = StepRunSerializer(many=True, read_only=True)
    schedule = serializers.CharField(
        source="schedule.name",
        read_only=True,
        default=None,
        help_text="The schedule trigger that started it (its slot in `scheduled_for`).",
    )

    class Meta:
        model = WorkflowRun
        fields = [
            "id",
            "workflow",
            "owner",
            "revision",
            "status",
            "outcome",
            "message",
            "parameters",
            "event",
            "schedule",
            "scheduled_for",
            "created_by",
            "created_at",
            "started_at",
            "ended_at",
            "cancel_requested",
            "depth",
            "steps",
        ]


class WorkflowRunSummarySerializer(WorkflowRunSerializer):
    """A run in a list: its steps without their outputs (WorkflowRunSerializer has them)."""

    steps = StepRunSummarySerializer(many=True, read_only=True)


class SecretSerializer(RejectUnknownFields, serializers.Serializer):
    value = StrictCharField(
        max_length=WorkflowSecret.MAX_LENGTH,
        trim_whitespace=False,
        write_only=True,
        help_text="Kept in Vault; never shown back.",
    )
