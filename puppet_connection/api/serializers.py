from puppet_connection.models import PuppetConnection
from relay.api.serializers import TokenField, TokenHolderSerializer


class PuppetConnectionSerializer(TokenHolderSerializer):
    class Meta:
        model = PuppetConnection
        fields = [
            "id",
            "name",
            "description",
            "owner",
            "token_prefix",
            "platform",
            "bridge_backend",
            "created",
            "last_used",
            "token_regenerated_at",
        ]
        read_only_fields = [
            "id",
            "platform",
            "bridge_backend",
            "created",
            "last_used",
            "token_regenerated_at",
        ]


class PuppetConnectionTokenSerializer(PuppetConnectionSerializer):
    """The connection with its plain token: only in the create and regenerate answers."""

    token = TokenField()

    class Meta(PuppetConnectionSerializer.Meta):
        fields = [*PuppetConnectionSerializer.Meta.fields, "token"]
