from connections.api.serializers import SlackConnectionSerializer
from connections.models import SlackConnection
from relay.api.views import OwnedViewSet


class SlackConnectionViewSet(OwnedViewSet):
    """`slack` connections. The token is given on create and replaced with PATCH `{"token"}`;
    no answer ever shows it. Users manage their own; anyone else's need the admin's
    permissions."""

    queryset = SlackConnection.objects.none()  # the model, for the schema; get_queryset() scopes
    serializer_class = SlackConnectionSerializer
