from django.db.models import QuerySet
from rest_framework.permissions import IsAuthenticated

from connections.api.serializers import SlackConnectionSerializer
from connections.models import Connection, SlackConnection
from connections.permissions import ConnectionPermission, connections_for
from relay.api.views import OwnedViewSet


class ConnectionRules:
    """Every connection type's viewset: who sees and does what is connections.permissions, as
    in the admin (only the owner or a superuser changes one, or sets or regenerates its token;
    other staff's permissions give view and delete)."""

    permission_classes = [IsAuthenticated, ConnectionPermission]

    def get_queryset(self) -> QuerySet[Connection]:
        rows = self.queryset.model._default_manager.select_related("owner")  # type: ignore[attr-defined]
        return connections_for(self.request.user, rows)  # type: ignore[attr-defined]


class SlackConnectionViewSet(ConnectionRules, OwnedViewSet):
    """`slack` connections. The token is given on create and replaced with PATCH `{"token"}`;
    no answer ever shows it. Users manage their own; anyone else's are seen and deleted with
    the admin's permissions, and changed by superusers only."""

    queryset = SlackConnection.objects.none()  # the model, for the schema; get_queryset() scopes
    serializer_class = SlackConnectionSerializer
