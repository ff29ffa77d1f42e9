from drf_spectacular.utils import extend_schema, extend_schema_view

from connections.api.views import ConnectionRules
from puppet_connection.api.serializers import PuppetConnectionSerializer, PuppetConnectionTokenSerializer
from puppet_connection.models import PuppetConnection
from relay.api.views import TokenHolderViewSet


@extend_schema_view(
    create=extend_schema(responses={201: PuppetConnectionTokenSerializer}),
    regenerate=extend_schema(request=None, responses={200: PuppetConnectionTokenSerializer}),
)
class PuppetConnectionViewSet(ConnectionRules, TokenHolderViewSet):
    """`puppet` connections. Users manage their own; anyone else's are seen and deleted with
    the admin's permissions, and changed (or their tokens regenerated) by superusers only."""

    queryset = PuppetConnection.objects.none()  # the model, for the schema; get_queryset() scopes
    serializer_class = PuppetConnectionSerializer
    token_serializer_class = PuppetConnectionTokenSerializer
