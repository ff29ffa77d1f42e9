import uuid

from django.conf import settings
from django.db.models import QuerySet
from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, status
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.viewsets import GenericViewSet

from relay.api.authentication import ConnectionTokenAuthentication
from relay.api.exceptions import Conflict as ConflictProblem
from relay.api.permissions import IsConnection
from runs.api.serializers import AcceptSerializer, RunCreateSerializer, StateSerializer
from runs.models import OPEN_STATES, Conflict, Run, Status
from runs.notify import wait_for_runs


class RunCursorPagination(CursorPagination):
    """Oldest first. The body stays the RFC's `{"runs": [...]}`; when there is another page,
    `next` (its URL) stands beside `runs` and in a `Link: <…>; rel="next"` header."""

    ordering = ("created_at", "id")
    page_size = 100
    page_size_query_param = "limit"
    max_page_size = 500

    def decode_cursor(self, request: Request) -> Cursor | None:
        # DRF takes the position in a cursor on trust; a client may send any cursor, and a
        # position that is no time would reach the query as a 500.
        cursor = super().decode_cursor(request)
        if cursor is not None and cursor.position is not None:
            try:
                moment = parse_datetime(cursor.position) if len(cursor.position) <= 64 else None
            except ValueError:  # well formed, but no such time (month 13)
                moment = None
            if moment is None or moment.tzinfo is None:
                raise exceptions.NotFound(self.invalid_cursor_message)
        return cursor

    def get_paginated_response(self, data: list) -> Response:
        following = self.get_next_link()
        if following is None:
            return Response({"runs": data})
        return Response({"runs": data, "next": following}, headers={"Link": f'<{following}>; rel="next"'})


class RunViewSet(GenericViewSet):
    """`/_puppet/runs`: a connection's runs. Another connection's run is a 404."""

    authentication_classes = [ConnectionTokenAuthentication]
    permission_classes = [IsConnection]
    pagination_class = RunCursorPagination
    queryset = Run.objects.none()  # for the schema; get_queryset() scopes by connection
    serializer_class = RunCreateSerializer

    def get_queryset(self) -> QuerySet[Run]:
        return Run.objects.filter(connection=self.request.auth)

    def get_object(self) -> Run:
        try:
            return self.get_queryset().get(pk=self.kwargs["pk"])
        except Run.DoesNotExist:
            raise exceptions.NotFound("No such run for this connection.") from None

    @extend_schema(
        parameters=[
            OpenApiParameter("status", enum=[s.value for s in OPEN_STATES]),
            OpenApiParameter(
                "wait",
                int,
                description=f"Seconds (at most {settings.RUN_LONG_POLL_MAX}) to wait for a pending run.",
            ),
        ]
    )
    def list(self, request: Request) -> Response:
        runs = self.get_queryset().filter(status__in=OPEN_STATES)
        wanted = request.query_params.get("status")
        if wanted is not None:
            if wanted not in OPEN_STATES:
                raise exceptions.ValidationError({"status": [f"One of {', '.join(OPEN_STATES)}."]})
            runs = runs.filter(status=wanted)
        wait = _wait_seconds(request)
        if wait and "cursor" not in request.query_params:
            # Long-poll: hold the answer until this connection has a pending run.
            pending = self.get_queryset().filter(status=Status.PENDING)
            wait_for_runs(str(request.auth.pk), wait, pending.exists)
        page = self.paginate_queryset(runs)
        return self.get_paginated_response([run.to_dict() for run in page])

    def create(self, request: Request) -> Response:
        serializer = RunCreateSerializer(data=request.data, context={"connection": request.auth})
        serializer.is_valid(raise_exception=True)
        run = Run.create_for(request.auth, serializer.validated_data)
        return Response(run.to_dict(), status=status.HTTP_201_CREATED)

    def retrieve(self, request: Request, pk: uuid.UUID) -> Response:
        return Response(self.get_object().to_dict())

    @extend_schema(request=AcceptSerializer)
    def accept(self, request: Request, pk: uuid.UUID) -> Response:
        body = AcceptSerializer(data=request.data if isinstance(request.data, dict) else {})
        body.is_valid(raise_exception=True)
        run = self.get_object()
        try:
            lease = run.accept(body.validated_data.get("lease_id"), request.auth.token_prefix)
        except Conflict as exc:
            raise ConflictProblem(str(exc)) from None
        return Response(
            {"id": str(run.id), "lease_id": str(lease), "state": run.state}, status=status.HTTP_202_ACCEPTED
        )

    @extend_schema(request=StateSerializer)
    def state(self, request: Request, pk: uuid.UUID) -> Response:
        if not isinstance(request.data, dict):
            raise exceptions.ValidationError({"non_field_errors": ["The state must be a JSON object."]})
        body = StateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            run = Run.update_state_of(request.auth, pk, body.validated_data, request.auth.token_prefix)
        except Run.DoesNotExist:
            raise exceptions.NotFound("No such run for this connection.") from None
        except Conflict as exc:
            raise ConflictProblem(str(exc)) from None
        # The shipped bridge reads this body as the run's new state.
        return Response(run.state, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None)
    def cancel(self, request: Request, pk: uuid.UUID) -> Response:
        run = self.get_object()
        try:
            run.cancel(request.auth.token_prefix)
        except Conflict as exc:
            raise ConflictProblem(str(exc)) from None
        return Response(run.to_dict(), status=status.HTTP_202_ACCEPTED)


def _wait_seconds(request: Request) -> int:
    raw = request.query_params.get("wait")
    if raw is None:
        return 0
    if not raw.isdigit() or int(raw) > settings.RUN_LONG_POLL_MAX:
        raise exceptions.ValidationError({"wait": [f"Whole seconds from 0 to {settings.RUN_LONG_POLL_MAX}."]})
    return int(raw)
