import uuid

from django.conf import settings
from django.db.models import QuerySet
from django.http import FileResponse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, status
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.viewsets import GenericViewSet

from puppet_connection.api.authentication import ConnectionTokenAuthentication, IsConnection
from relay.api.exceptions import Conflict as ConflictProblem
from relay.api.params import query_int
from relay.api.parsers import BoundedJSONParser
from runs import results
from runs.api.serializers import AcceptSerializer, RunCreateSerializer, StateSerializer
from runs.models import OLD_TASK_RUNS, OPEN_STATES, Conflict, Run, Status, offered
from runs.notify import wait_for_runs


class RunCursorPagination(CursorPagination):
    """Oldest first. Without `limit`, every run: the shipped bridge reads only the first page
    and ignores `next`, so a page size of its own would hide runs from it. With `limit`,
    pages, and the body stays the RFC's `{"runs": [...]}` with `next` (its URL) beside `runs`
    and in a `Link: <…>; rel="next"` header."""

    ordering = ("created_at", "id")
    page_size = None
    page_size_query_param = "limit"
    max_page_size = 500

    def get_page_size(self, request: Request) -> int | None:
        limit = query_int(request, self.page_size_query_param, 0, lowest=1)
        return min(limit, self.max_page_size) if limit else None

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
            OpenApiParameter(
                "status",
                enum=[s.value for s in OPEN_STATES],
                description="`pending` (the default): runs no bridge has accepted, the only ones"
                " listed without `status`; `accepted`: accepted, not started (they show `pending`"
                " with `accepted_at`); `in-progress`.",
            ),
            OpenApiParameter(
                "wait",
                int,
                description=f"Seconds (at most {settings.RUN_LONG_POLL_MAX}) to wait for a pending run.",
            ),
        ]
    )
    def list(self, request: Request) -> Response:
        # By the recorded status. Without `status`, only the runs nobody holds: the shipped
        # agent starts a job for every run the list shows `pending`, and an accepted run
        # shows `pending` until it is in progress (runs.models.wire_status), so listing it
        # would have the agent start it twice (contract §1). Held runs are listed only to
        # whoever asks for them by their status.
        wanted = request.query_params.get("status", Status.PENDING)
        if wanted not in OPEN_STATES:
            raise exceptions.ValidationError({"status": [f"One of {', '.join(OPEN_STATES)}."]})
        ours = from_our_bridge(request)
        if wanted == Status.PENDING:
            runs = self.get_queryset().filter(offered(timezone.now(), to_our_bridge=ours))
        else:
            runs = self.get_queryset().filter(status=wanted)
        if not ours:
            runs = runs.exclude(OLD_TASK_RUNS)
        wait = _wait_seconds(request)
        self.paginator.get_page_size(request)  # a bad limit is a 400 before any wait
        waited = getattr(request._request, "scope", {}).get("relay.waited", False)
        if wait and not waited and "cursor" not in request.query_params:
            # Long-poll, when the ASGI application has not waited already (runs.longpoll):
            # the test client, a WSGI server, SQLite. This holds a thread while it waits.
            pending = self.get_queryset().filter(status=Status.PENDING)
            wait_for_runs(str(request.auth.pk), wait, pending.exists)
        page = self.paginate_queryset(runs)
        if page is None:  # no limit: all of them
            return Response({"runs": [run.to_dict() for run in runs]})
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
        state = body.validated_data
        held = self.get_queryset().filter(pk=pk).exclude(status=Status.PENDING)
        if state.get("run_results") is not None and held.exists():
            # Large results are stored before the run points at them (a PUT refused below
            # leaves an object that nothing points at, which a resend reuses).
            state = results.keep(state)
        try:
            run = Run.update_state_of(request.auth, pk, state, request.auth.token_prefix)
        except Run.DoesNotExist:
            raise exceptions.NotFound("No such run for this connection.") from None
        except Conflict as exc:
            raise ConflictProblem(str(exc)) from None
        # The shipped bridge reads this body as the run's new state.
        return Response(run.state, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={(200, "application/json"): dict})
    def results(self, request: Request, pk: uuid.UUID) -> Response | FileResponse:
        """The run's full results: from its row, or streamed from storage when they were too
        large for it (the state then has `run_results_stored` and a summary)."""
        run = self.get_object()
        if run.results_sha256:
            return FileResponse(results.open_stored(run.results_sha256), content_type="application/json")
        if run.run_results is None:
            raise exceptions.NotFound("This run has no results (yet).")
        return Response(run.run_results)

    @extend_schema(request=None)
    def cancel(self, request: Request, pk: uuid.UUID) -> Response:
        run = self.get_object()
        try:
            run.cancel(request.auth.token_prefix)
        except Conflict as exc:
            raise ConflictProblem(str(exc)) from None
        return Response(run.to_dict(), status=status.HTTP_202_ACCEPTED)


class StateParser(BoundedJSONParser):
    """A final state carries the whole fleet's results: a larger body than other requests'."""

    def max_bytes(self) -> int:
        return settings.RUN_STATE_MAX_BODY_BYTES


def from_our_bridge(request: Request) -> bool:
    """Whether the caller is this service's own bridge (`relay-bridge`, every version of which
    sends `X-Relay-Backend` on every call), which can work a task run made before task runs
    had a scope. The shipped Ruby agent sends no such header, and exits on such a run."""
    return bool(request.META.get("HTTP_X_RELAY_BACKEND", "").strip())


def _wait_seconds(request: Request) -> int:
    return query_int(request, "wait", 0, highest=settings.RUN_LONG_POLL_MAX)
