from drf_spectacular.utils import extend_schema, extend_schema_view, inline_serializer
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from relay.api.authentication import TriggerTokenAuthentication
from relay.api.permissions import IsTrigger
from relay.api.views import TokenHolderViewSet
from triggers.api.serializers import TriggerSerializer, TriggerTokenSerializer
from triggers.ingest import receive
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


class EventIngestView(APIView):
    """`POST /api/events`: a Puppet report (YAML or JSON) or a Relay push body, with the
    trigger's token as Bearer or as the Basic password. Answers 202 with the event id once the
    body and the event are stored; a worker reads the report later."""

    authentication_classes = [TriggerTokenAuthentication]
    permission_classes = [IsTrigger]
    parser_classes: list = []  # the body is streamed to storage, never parsed here

    @extend_schema(
        request={"application/json": dict, "application/x-yaml": str},
        responses={202: inline_serializer("EventAccepted", {"id": serializers.UUIDField()})},
    )
    def post(self, request: Request) -> Response:
        event, _ = receive(request._request, request.auth)
        return Response({"id": str(event.id)}, status=status.HTTP_202_ACCEPTED)
