import uuid

from django.core.files.storage import storages
from django.db.models import QuerySet
from django.http import FileResponse
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
    inline_serializer,
)
from rest_framework import exceptions, mixins, serializers, status, viewsets
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from relay.api.exceptions import Conflict
from relay.api.params import query_text
from relay.api.views import TokenHolderViewSet
from triggers import webhooks
from triggers.api.authentication import IsTrigger, TriggerTokenAuthentication
from triggers.api.serializers import (
    REPORT_STATUSES,
    EventListSerializer,
    EventSerializer,
    TriggerSerializer,
    TriggerTokenSerializer,
)
from triggers.ingest import receive
from triggers.models import Event, EventState, Trigger, TriggerKind
from triggers.objects import body_name
from triggers.permissions import Action, TriggerPermission, may, may_events, triggers_for


@extend_schema_view(
    create=extend_schema(responses={201: TriggerTokenSerializer}),
    regenerate=extend_schema(request=None, responses={200: TriggerTokenSerializer}),
    destroy=extend_schema(
        responses={204: None, 409: OpenApiResponse(description="A workflow's trigger (an RFC 9457 problem).")}
    ),
)
class TriggerViewSet(TokenHolderViewSet):
    """Push triggers. Who sees and does what is triggers.permissions, as in the admin: users
    manage their own; other staff's permissions give view and delete; only the owner or a
    superuser changes one (its filters, Slack webhook, name) or regenerates its token.

    A workflow's push triggers are here too (`workflow` names it): their filters, Slack
    webhook and token are managed here, their names and lives by the workflow's document."""

    queryset = Trigger.objects.none()  # the model, for the schema; get_queryset() scopes
    serializer_class = TriggerSerializer
    token_serializer_class = TriggerTokenSerializer
    permission_classes = [IsAuthenticated, TriggerPermission]

    def get_queryset(self) -> QuerySet[Trigger]:
        return triggers_for(self.request.user, Trigger.objects.select_related("owner", "workflow"))

    def check_object_permissions(self, request: Request, obj: Trigger) -> None:
        if request.method == "DELETE" and obj.workflow_id is not None and may(request.user, Action.VIEW, obj):
            # No one deletes it here; whoever sees it hears where it is deleted.
            raise Conflict(
                f"This push trigger belongs to workflow {obj.workflow.name!r}: remove it from the "
                "workflow's `triggers:` (a new revision) to delete it."
            )
        super().check_object_permissions(request, obj)


class EventIngestView(APIView):
    """`POST /api/events`: a Puppet report (YAML or JSON) or a Relay push body (the module's
    2.x, or its releases 1.x), with the trigger's token as Bearer or as the Basic password.
    Answers 202 with the event id once the body and the event are stored; a worker reads the
    report later. A JSON body small enough to be read whole at the door and that is no report
    is refused then (400, 422)."""

    authentication_classes = [TriggerTokenAuthentication]
    permission_classes = [IsTrigger]
    parser_classes: list = []  # the body is streamed to storage, never parsed here

    @extend_schema(
        request={"application/json": dict, "application/x-yaml": str},
        responses={
            202: inline_serializer("EventAccepted", {"id": serializers.UUIDField()}),
            400: OpenApiResponse(description="A JSON body the worker could not read (an RFC 9457 problem)."),
            422: OpenApiResponse(
                description="A JSON body that is no report of any shape this service reads: no host "
                "(an RFC 9457 problem)."
            ),
        },
    )
    def post(self, request: Request) -> Response:
        trigger = request.auth
        if trigger.kind != TriggerKind.PUSH:
            raise exceptions.PermissionDenied(
                f"This is a {trigger.kind} trigger's token: send its events to its own URL, "
                f"{trigger.webhook_url()}"
            )
        event, _ = receive(request._request, trigger)
        return Response({"id": str(event.id)}, status=status.HTTP_202_ACCEPTED)


class WebhookIngestView(APIView):
    """`POST /api/webhooks/{id}/`: a webhook trigger's URL. The body, any JSON object, is the
    event as it is (what `!Data` and `${event}` read in the trigger's `when` and binding),
    with the trigger's own token as Bearer or as the Basic password (so a sender that can set
    no header may put it in the URL's user part). Answers 202 with the event id once the
    body and the event are stored; a worker starts the run. An `Idempotency-Key` header makes
    a resend the same event. Only images that pass the body through are stood in for
    (WEBHOOK_PASS_THROUGH_IMAGES); another image's trigger refuses events with a 409."""

    authentication_classes = [TriggerTokenAuthentication]
    permission_classes = [IsTrigger]
    parser_classes: list = []  # the body is streamed to storage, then checked

    @extend_schema(
        request={"application/json": dict},
        responses={
            202: inline_serializer("WebhookEventAccepted", {"id": serializers.UUIDField()}),
            409: OpenApiResponse(
                description="The trigger's image is not a pass-through (an RFC 9457 problem)."
            ),
        },
    )
    def post(self, request: Request, trigger_id: uuid.UUID) -> Response:
        trigger = request.auth
        if trigger.pk != trigger_id or trigger.kind != TriggerKind.WEBHOOK:
            # Another trigger's token is no key to this URL; said as for an unknown token.
            raise exceptions.AuthenticationFailed("Invalid token.")
        event, _ = webhooks.receive(request._request, trigger)
        return Response({"id": str(event.id)}, status=status.HTTP_202_ACCEPTED)


EVENT_PARTS = ["body", "report", "logs", "events"]
# The list's filters, and the values each may take (None: any host name).
EVENT_FILTERS: dict[str, list[str] | None] = {
    "state": [s.value for s in EventState],
    "host": None,
    "status": REPORT_STATUSES,
}


@extend_schema_view(
    list=extend_schema(
        parameters=[
            OpenApiParameter("state", enum=EVENT_FILTERS["state"]),
            OpenApiParameter("host", str),
            OpenApiParameter("status", enum=EVENT_FILTERS["status"]),
        ]
    )
)
class EventViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet
):
    """A trigger's events, newest first, to its owner and to staff who may view events. Deleting
    one deletes its stored body and parts too, unless another event shares them (triggers.objects)."""

    queryset = Event.objects.none()  # the model, for the schema; get_queryset() scopes
    serializer_class = EventSerializer
    lookup_value_converter = "uuid"

    def get_serializer_class(self) -> type:
        return EventListSerializer if self.action == "list" else EventSerializer

    def get_queryset(self) -> QuerySet[Event]:
        # Another user's events need the permission to view events (their reports, bodies
        # and parts); seeing their trigger is not enough (triggers.permissions).
        user = self.request.user
        trigger = Trigger.objects.filter(pk=self.kwargs["trigger_pk"]).first()
        if trigger is not None and not may_events(user, Action.VIEW, trigger):
            if not may(user, Action.VIEW, trigger):
                trigger = None  # they may not know it exists
            else:
                raise exceptions.PermissionDenied(
                    "Reading another user's events needs the permission to view events."
                )
        if trigger is None:
            raise exceptions.NotFound("No such trigger.")
        events = Event.objects.filter(trigger=trigger)
        for field, choices in EVENT_FILTERS.items():
            value = query_text(self.request, field)
            if value is None:
                continue
            if choices and value not in choices:
                raise exceptions.ValidationError({field: [f"One of {', '.join(choices)}."]})
            events = events.filter(**{field: value})
        return events

    def perform_destroy(self, instance: Event) -> None:
        if not may_events(self.request.user, Action.DELETE, instance.trigger):
            raise exceptions.PermissionDenied(
                "Deleting another user's events needs the permission to delete events."
            )
        instance.delete()

    @extend_schema(
        parameters=[OpenApiParameter("name", enum=EVENT_PARTS, location=OpenApiParameter.PATH)],
        responses={(200, "application/octet-stream"): bytes},
    )
    def part(self, request: Request, trigger_pk: str, pk: str, name: str) -> FileResponse:
        """Download an offloaded part (`report`, `logs`, `events`) or the `body` as received,
        streamed from storage."""
        event = self.get_object()
        if name == "body":
            stored, content_type = (
                body_name(event.body_sha256),
                ("application/x-yaml" if event.body_format == "yaml" else "application/json"),
            )
        elif name in event.parts:
            stored, content_type = event.parts[name]["name"], "application/json"
        else:
            raise exceptions.NotFound(f"This event has no part {name!r}.")
        response = FileResponse(storages["events"].open(stored, "rb"), content_type=content_type)
        response["Content-Disposition"] = f'attachment; filename="{event.pk}-{name}"'
        return response
