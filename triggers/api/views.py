from drf_spectacular.utils import extend_schema, extend_schema_view

from relay.api.views import TokenHolderViewSet
from triggers.api.serializers import TriggerSerializer, TriggerTokenSerializer
from triggers.models import Trigger


@extend_schema_view(
    create=extend_schema(responses={201: TriggerTokenSerializer}),
    regenerate=extend_schema(request=None, responses={200: TriggerTokenSerializer}),
)
class TriggerViewSet(TokenHolderViewSet):
    """Push triggers. Users see their own; staff see everyone's."""

    queryset = Trigger.objects.none()  # the model, for the schema; get_queryset() scopes
    serializer_class = TriggerSerializer
    token_serializer_class = TriggerTokenSerializer
