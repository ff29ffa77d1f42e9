from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from relay.api.serializers import StrictCharField, TokenField, TokenHolderSerializer
from triggers.models import Event, Trigger
from triggers.slack import check_webhook_url

REPORT_STATUSES = ["changed", "failed", "unchanged"]


def filter_list(**kwargs: Any) -> serializers.ListField:
    return serializers.ListField(
        child=StrictCharField(max_length=255, **kwargs), max_length=100, required=False
    )


class TriggerSerializer(TokenHolderSerializer):
    statuses = serializers.ListField(
        child=serializers.ChoiceField(REPORT_STATUSES), max_length=3, required=False
    )
    environments = filter_list()
    host_globs = filter_list()
    resource_types = filter_list()
    title_globs = filter_list()
    tags = filter_list()
    slack_webhook_url = serializers.URLField(
        write_only=True,
        required=False,
        allow_blank=True,
        max_length=2000,
        validators=[check_webhook_url],
        help_text="A Slack incoming-webhook URL (https, to a host in SLACK_WEBHOOK_HOSTS), kept in "
        "Vault; empty removes it.",
    )
    workflow = serializers.CharField(
        source="workflow.name",
        read_only=True,
        default=None,
        help_text="The workflow whose document declares this push trigger (null for a trigger of its own).",
    )

    url = serializers.SerializerMethodField(help_text="A webhook trigger's: where its events go.")

    class Meta:
        model = Trigger
        fields = [
            "id",
            "name",
            "kind",
            "url",
            "description",
            "owner",
            "workflow",
            "token_prefix",
            "statuses",
            "environments",
            "host_globs",
            "resource_types",
            "title_globs",
            "tags",
            "slack_webhook_url",
            "has_slack_webhook",
            "created",
            "last_used",
            "token_regenerated_at",
        ]
        read_only_fields = ["id", "kind", "has_slack_webhook", "created", "last_used", "token_regenerated_at"]

    def get_url(self, trigger: Trigger) -> str | None:
        return trigger.webhook_url() or None

    def validate_name(self, name: str) -> str:
        if self.instance is not None and self.instance.workflow_id is not None:
            if name != self.instance.name:
                raise serializers.ValidationError(
                    "This push trigger is named by its workflow's document: rename it there.", "workflow"
                )
            return name
        return super().validate_name(name)

    def namesakes(self, owner: AbstractBaseUser) -> QuerySet:
        # Workflows' triggers are named within their workflow.
        return super().namesakes(owner).filter(workflow__isnull=True)

    def pop_secret(self, validated_data: dict[str, Any]) -> dict[str, str]:
        url = validated_data.pop("slack_webhook_url", "")
        validated_data["has_slack_webhook"] = bool(url)
        return {"slack_webhook_url": url} if url else {}

    def update(self, instance: Trigger, validated_data: dict[str, Any]) -> Trigger:
        if "slack_webhook_url" in validated_data:
            instance.set_slack_webhook(validated_data.pop("slack_webhook_url"))
        return super().update(instance, validated_data)


class TriggerTokenSerializer(TriggerSerializer):
    """The trigger with its plain token: only in the create and regenerate answers."""

    token = TokenField()

    class Meta(TriggerSerializer.Meta):
        fields = [*TriggerSerializer.Meta.fields, "token"]


class EventSerializer(serializers.ModelSerializer):
    parts = serializers.SerializerMethodField()
    workflow_run = serializers.SerializerMethodField()

    class Meta:
        model = Event
        fields = [
            "id",
            "state",
            "received_at",
            "processed_at",
            "host",
            "status",
            "key",
            "transaction_uuid",
            "failure_reason",
            "filter_note",
            "duplicate_of",
            "workflow_start",
            "workflow_run",
            "body_format",
            "body_size",
            "body_sha256",
            "summary",
            "data",
            "parts",
        ]

    @extend_schema_field(serializers.UUIDField(allow_null=True))
    def get_workflow_run(self, event: Event) -> str | None:
        """The workflow run this event started (a workflow's push trigger's)."""
        run_id = next(iter(event.workflow_runs.values_list("pk", flat=True)), None)
        return str(run_id) if run_id else None

    def get_parts(self, event: Event) -> dict[str, dict[str, Any]]:
        """Each offloaded part, and the body as received, with a link to download it."""
        request = self.context["request"]
        parts = {"body": {"size": event.body_size, "sha256": event.body_sha256}}
        parts.update({name: {"size": p["size"], "sha256": p["sha256"]} for name, p in event.parts.items()})
        base = f"/api/triggers/{event.trigger_id}/events/{event.id}/parts/"
        return {
            name: {**meta, "url": request.build_absolute_uri(base + name)} for name, meta in parts.items()
        }


class EventListSerializer(EventSerializer):
    class Meta(EventSerializer.Meta):
        fields = [
            f for f in EventSerializer.Meta.fields if f not in ("summary", "data", "parts", "workflow_run")
        ]
