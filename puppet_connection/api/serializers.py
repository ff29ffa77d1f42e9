from typing import Any

from rest_framework import serializers

from puppet_connection.models import PuppetConnection, settings_error
from relay.api.serializers import RejectUnknownFields, TokenField, TokenHolderSerializer
from runs.api.serializers import ScopeSerializer
from runs.models import Run


class PuppetConnectionSerializer(TokenHolderSerializer):
    """`platform`, `backend` and `puppetdb` are the connection's settings, which runs are checked against;
    `reported_*` is what its bridge last said (X-Relay-Platform, X-Relay-Backend, the first product of
    its User-Agent), and
    `warnings` says where the two disagree."""

    warnings = serializers.SerializerMethodField(
        help_text="Where the bridge's reports contradict the settings."
    )

    class Meta:
        model = PuppetConnection
        fields = [
            "id",
            "name",
            "description",
            "owner",
            "token_prefix",
            "platform",
            "backend",
            "puppetdb",
            "reported_platform",
            "reported_backend",
            "reported_agent",
            "warnings",
            "created",
            "last_used",
            "token_regenerated_at",
        ]
        read_only_fields = [
            "id",
            "reported_platform",
            "reported_backend",
            "reported_agent",
            "created",
            "last_used",
            "token_regenerated_at",
        ]

    def get_warnings(self, connection: PuppetConnection) -> list[str]:
        return connection.bridge_warnings()

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        current = self.instance
        platform = attrs.get("platform", current.platform if current else "")
        backend = attrs.get("backend", current.backend if current else "")
        error = settings_error(platform, backend)
        if error:
            raise serializers.ValidationError({"backend": error}, "invalid")
        return attrs


class PuppetConnectionTokenSerializer(PuppetConnectionSerializer):
    """The connection with its plain token: only in the create and regenerate answers."""

    token = TokenField()

    class Meta(PuppetConnectionSerializer.Meta):
        fields = [*PuppetConnectionSerializer.Meta.fields, "token"]


class PreviewSerializer(RejectUnknownFields, serializers.Serializer):
    """What to preview: a `scope` as a run takes it, or a `run` of this connection (its scope)."""

    scope = ScopeSerializer(required=False)
    run = serializers.UUIDField(required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if len(attrs) != 1:
            raise serializers.ValidationError("Give a scope or a run, not both or neither.", "invalid")
        if "run" in attrs:
            run = Run.objects.filter(connection=self.context["connection"], pk=attrs["run"]).first()
            if run is None:
                raise serializers.ValidationError({"run": ["No such run for this connection."]}, "invalid")
            if not run.scope:
                raise serializers.ValidationError({"run": ["This run has no scope."]}, "invalid")
            return {"scope": run.scope}
        return attrs
