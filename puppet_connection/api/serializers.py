from django.db import IntegrityError
from rest_framework import serializers

from puppet_connection.models import PuppetConnection
from relay.api.serializers import StrictModelSerializer


class PuppetConnectionSerializer(StrictModelSerializer):
    owner = serializers.CharField(source="owner.get_username", read_only=True)
    token_prefix = serializers.CharField(read_only=True)

    class Meta:
        model = PuppetConnection
        fields = [
            "id",
            "name",
            "description",
            "owner",
            "token_prefix",
            "created",
            "last_used",
            "token_regenerated_at",
        ]
        read_only_fields = ["id", "created", "last_used", "token_regenerated_at"]

    def validate_name(self, name: str) -> str:
        owner = self.context["request"].user
        taken = PuppetConnection.objects.filter(owner=owner, name=name)
        if self.instance is not None:
            taken = taken.exclude(pk=self.instance.pk)
        if taken.exists():
            raise serializers.ValidationError("You already have a connection with this name.", "unique")
        return name

    def create(self, validated_data: dict) -> PuppetConnection:
        try:
            connection, token = PuppetConnection.create_with_token(
                owner=self.context["request"].user, **validated_data
            )
        except IntegrityError:
            # Lost a race with a concurrent create of the same name.
            raise serializers.ValidationError(
                {"name": ["You already have a connection with this name."]}, "unique"
            ) from None
        self.context["token"] = token
        return connection


class TokenSerializer(PuppetConnectionSerializer):
    """The connection with its plain token: only in the create and regenerate answers."""

    token = serializers.SerializerMethodField()

    class Meta(PuppetConnectionSerializer.Meta):
        fields = [*PuppetConnectionSerializer.Meta.fields, "token"]

    def get_token(self, connection: PuppetConnection) -> str:
        return str(self.context["token"])
