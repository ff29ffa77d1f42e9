from typing import Any

from django.core.validators import RegexValidator
from django.db import IntegrityError
from django.views.decorators.debug import sensitive_variables
from rest_framework import serializers

from connections.models import SLACK_TOKEN_RE, SlackConnection
from relay.api.serializers import OwnedSerializer, StrictCharField
from relay.tokens import PlainToken

SLACK_TOKEN_HELP = "A Slack app's bot token (xoxb-…). Write-only: it is kept in Vault and never shown."
slack_token = RegexValidator(SLACK_TOKEN_RE, "Not a Slack token: give a Slack app's bot token (xoxb-…).")


class SecretCharField(StrictCharField):
    """A secret the user gives: write-only, and kept as a PlainToken, whose repr() hides it.
    Its errors never repeat it."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(write_only=True, **kwargs)

    def to_internal_value(self, data: Any) -> PlainToken:
        return PlainToken(super().to_internal_value(data))


class SlackConnectionSerializer(OwnedSerializer):
    token = SecretCharField(
        max_length=510,
        validators=[slack_token],
        help_text=SLACK_TOKEN_HELP,
    )

    class Meta:
        model = SlackConnection
        fields = ["id", "name", "description", "owner", "created", "token_replaced_at", "token"]
        read_only_fields = ["id", "created", "token_replaced_at"]

    @sensitive_variables("validated_data", "token")
    def create(self, validated_data: dict[str, Any]) -> SlackConnection:
        owner = self.context["request"].user
        try:
            return SlackConnection.create_with_token(owner=owner, **validated_data)
        except IntegrityError:
            # Lost a race with a concurrent create of the same name.
            raise serializers.ValidationError({"name": [self.name_taken(owner)]}, "unique") from None

    @sensitive_variables("validated_data", "token")
    def update(self, instance: SlackConnection, validated_data: dict[str, Any]) -> SlackConnection:
        token = validated_data.pop("token", None)
        if token is None:
            return super().update(instance, validated_data)
        for field, value in validated_data.items():
            setattr(instance, field, value)
        try:
            instance.save_with_token(token)
        except IntegrityError:
            # Lost a race with a concurrent rename to the same name.
            raise serializers.ValidationError({"name": [self.name_taken(instance.owner)]}, "unique") from None
        return instance
