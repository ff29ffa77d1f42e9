from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import exceptions, status
from rest_framework.decorators import action
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from connections.api.views import ConnectionRules
from connections.permissions import Action, may
from inventory.filters import FilterError, filter_nodes
from inventory.models import Inventory
from inventory.scope import preview
from puppet_connection.api.serializers import (
    PreviewSerializer,
    PuppetConnectionSerializer,
    PuppetConnectionTokenSerializer,
)
from puppet_connection.models import PuppetConnection
from relay.api.params import query_int
from relay.api.views import TokenHolderViewSet


class NodePagination(CursorPagination):
    """By certname; `limit` nodes a page (default 100, at most 500), `next` to follow."""

    ordering = ("certname",)
    page_size = 100
    page_size_query_param = "limit"
    max_page_size = 500

    def get_page_size(self, request: Request) -> int:
        limit = query_int(request, self.page_size_query_param, 0, lowest=1)
        return min(limit, self.max_page_size) if limit else self.page_size

    def decode_cursor(self, request: Request) -> Cursor | None:
        # DRF takes the position on trust: a NUL in it would reach PostgreSQL (a 500).
        cursor = super().decode_cursor(request)
        if cursor is not None and cursor.position is not None:
            if len(cursor.position) > 255 or "\x00" in cursor.position:
                raise exceptions.NotFound(self.invalid_cursor_message)
        return cursor

    def get_paginated_response(self, data: list) -> Response:
        return Response({"nodes": data, "next": self.get_next_link(), "previous": self.get_previous_link()})


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

    def _seen(self) -> PuppetConnection:
        """The connection, for whoever may see it (reading its inventory changes nothing)."""
        try:
            return self.get_queryset().get(pk=self.kwargs["pk"])
        except PuppetConnection.DoesNotExist:
            raise exceptions.NotFound("No such connection.") from None

    @extend_schema(
        request=None,
        responses={200: dict},
        parameters=[
            OpenApiParameter("status", enum=["changed", "unchanged", "failed", "none"]),
            OpenApiParameter("state", enum=["active", "stale", "deactivated", "expired"]),
            OpenApiParameter("certname", description="Certnames beginning with this."),
            OpenApiParameter(
                "fact.<path>",
                description="e.g. `fact.os.family=Debian`: a fact the bridge's allow-list sends (else 400),"
                " compared as text.",
            ),
            OpenApiParameter("limit", int, description="Nodes a page (default 100, at most 500)."),
        ],
    )
    @action(detail=True, methods=["get"], permission_classes=[IsAuthenticated])
    def nodes(self, request: Request, pk: str | None = None) -> Response:
        """The connection's nodes, as its bridge last sent them from PuppetDB."""
        connection = self._seen()
        params = {key: value for key, value in request.query_params.items() if key not in ("cursor", "limit")}
        for key, value in params.items():
            if "\x00" in value or "\x00" in key:
                raise exceptions.ValidationError({key: ["Null characters are not allowed."]})
        try:
            nodes: QuerySet = filter_nodes(connection, params)
        except FilterError as exc:
            raise exceptions.ValidationError({exc.parameter: [str(exc)]}) from None
        paginator = NodePagination()
        page = paginator.paginate_queryset(nodes, request, view=self)
        return paginator.get_paginated_response([node.to_dict() for node in page or []])

    @extend_schema(request=PreviewSerializer, responses={200: dict})
    @action(detail=True, methods=["post"], permission_classes=[IsAuthenticated])
    def preview(self, request: Request, pk: str | None = None) -> Response:
        """Which nodes a run with this scope would touch, and which of them the inventory does
        not know, or knows as stale, deactivated or expired. Changes nothing."""
        connection = self._seen()
        body = PreviewSerializer(data=request.data, context={"connection": connection})
        body.is_valid(raise_exception=True)
        # A query is run on the owner's PuppetDB by their bridge, and can test any fact, past
        # the allow-list (`facts.secret ~ "^a"`): only the owner (or a superuser), or a run's
        # own scope, has it asked; staff who may only see the connection get what is known.
        ask = "run" in request.data or may(request.user, Action.CHANGE, connection)
        return Response(preview(connection, body.validated_data["scope"], ask=ask))

    @extend_schema(request=None, responses={202: dict})
    @action(detail=True, methods=["post"])
    def sync(self, request: Request, pk: str | None = None) -> Response:
        """Ask the bridge for an inventory sync now (it syncs at its next check)."""
        inventory = Inventory.of(self.get_object())
        inventory.request_sync()
        return Response({"sync_requested": True}, status=status.HTTP_202_ACCEPTED)
