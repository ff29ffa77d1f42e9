from django.db.models import QuerySet
from django.views.decorators.debug import sensitive_variables
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from puppet_connection.api.serializers import PuppetConnectionSerializer, TokenSerializer
from puppet_connection.models import PuppetConnection

# The token is in the body: no cache on the way may keep a copy.
NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}


class PuppetConnectionViewSet(
    mixins.CreateModelMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """`puppet` connections. Users see their own; staff see everyone's."""

    serializer_class = PuppetConnectionSerializer
    queryset = PuppetConnection.objects.none()  # for the schema; get_queryset() scopes by user
    lookup_value_converter = "uuid"
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self) -> QuerySet[PuppetConnection]:
        connections = PuppetConnection.objects.select_related("owner")
        if self.request.user.is_staff:
            return connections
        return connections.filter(owner=self.request.user)

    @extend_schema(responses={201: TokenSerializer})
    @sensitive_variables("serializer")
    def create(self, request: Request, *args: object, **kwargs: object) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        connection = serializer.save()
        body = TokenSerializer(connection, context=serializer.context).data
        return Response(body, status=status.HTTP_201_CREATED, headers=NO_STORE)

    @extend_schema(request=None, responses={200: TokenSerializer})
    @action(detail=True, methods=["post"])
    @sensitive_variables("token")
    def regenerate(self, request: Request, pk: str | None = None) -> Response:
        connection = self.get_object()
        token = connection.regenerate_token()
        body = TokenSerializer(connection, context={"request": request, "token": token}).data
        return Response(body, headers=NO_STORE)
