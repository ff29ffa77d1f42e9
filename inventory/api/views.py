"""`/_puppet/inventory`: the bridge's extension for sending its PuppetDB's inventory (the
shipped Ruby agent never calls it). With the connection's token, as `/_puppet/runs`.

  GET  /_puppet/inventory                       whether a sync is due (asked on demand), where
                                                the last one stands, and the preview queries
                                                waiting for the bridge: [{key, query}]
  POST /_puppet/inventory/queries               their answers: [{key, certnames} | {key, error}]
  POST /_puppet/inventory/syncs                 start one: {"facts": [allow-list]} ->
                                                {"id", "since", "full", page limits}
  PUT  /_puppet/inventory/syncs/{id}/nodes      one page: {"nodes": [...]} -> {"stored", "refused"}
  POST /_puppet/inventory/syncs/{id}/done       {"since": PuppetDB time} ends it well, or
                                                {"error": why} ends it failed (since stays)

A page is at most INVENTORY_PAGE_MAX_NODES nodes and INVENTORY_PAGE_MAX_BYTES bytes (413
before it is read); a page or an end for a sync that is no longer the one under way is 409,
and so is a start while another sync is under way (INVENTORY_SYNC_IDLE)."""

import uuid

from django.conf import settings
from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from inventory.models import Conflict, Inventory, PreviewQuery
from inventory.sync import CERTNAME, PageError, check_fact_paths, check_page
from puppet_connection.api.authentication import ConnectionTokenAuthentication, IsConnection
from relay.api.exceptions import Conflict as ConflictProblem
from relay.api.parsers import BoundedJSONParser

SINCE_CHARS = 64


def _aware(text: str) -> bool:
    """An ISO 8601 time with its offset: the bridge asks PuppetDB from it at the next sync."""
    try:
        moment = parse_datetime(text)
    except ValueError:
        return False
    return moment is not None and moment.tzinfo is not None


class PageParser(BoundedJSONParser):
    def max_bytes(self) -> int:
        return settings.INVENTORY_PAGE_MAX_BYTES


class BridgeView(APIView):
    authentication_classes = [ConnectionTokenAuthentication]
    permission_classes = [IsConnection]

    def inventory(self, request: Request) -> Inventory:
        return Inventory.of(request.auth)


def _status(inventory: Inventory) -> dict:
    return {
        "due": inventory.due(),
        "sync_requested_at": inventory.sync_requested_at,
        "synced_at": inventory.synced_at,
        "since": inventory.since or None,
        "facts": inventory.fact_paths,
        "last_error": inventory.last_error or None,
    }


class InventoryView(BridgeView):
    @extend_schema(request=None, responses={200: dict})
    def get(self, request: Request) -> Response:
        waiting = PreviewQuery.waiting(request.auth)[: settings.INVENTORY_QUERIES_WAITING]
        queries = [{"key": q.key, "query": q.query} for q in waiting]
        return Response({**_status(self.inventory(request)), "queries": queries})


class QueriesView(BridgeView):
    """The bridge's answers to the preview queries it was listed: `{"answers": [{"key",
    "certnames": [...]} or {"key", "error": "PuppetDB's message"}]}`. Unknown keys are ignored."""

    @extend_schema(request=dict, responses={200: dict})
    def post(self, request: Request) -> Response:
        body = request.data if isinstance(request.data, dict) else {}
        answers = body.get("answers")
        if not isinstance(answers, list) or len(answers) > settings.INVENTORY_QUERIES_WAITING:
            raise exceptions.ValidationError(
                {"answers": [f"A list of at most {settings.INVENTORY_QUERIES_WAITING} answers."]}
            )
        taken = 0
        for answer in answers:
            key = answer.get("key") if isinstance(answer, dict) else None
            certnames, error = (
                (answer.get("certnames"), answer.get("error")) if isinstance(answer, dict) else (0, 0)
            )
            names_ok = isinstance(certnames, list) and all(
                isinstance(n, str) and CERTNAME.match(n) for n in certnames
            )
            if not isinstance(key, str) or not (names_ok or (isinstance(error, str) and error)):
                raise exceptions.ValidationError(
                    {"answers": ["Each answer: {key, certnames: [certnames]} or {key, error: text}."]}
                )
            if names_ok and len(certnames) > settings.RUN_MAX_NODES:
                # The query's answer, not a bad one: a 400 would refuse the batch's other
                # answers too, and the bridge would send the same batch again each minute.
                names_ok = False
                error = (
                    f"the query names {len(certnames)} nodes, more than a run may ({settings.RUN_MAX_NODES})."
                )
            row = PreviewQuery.waiting(request.auth).filter(key=key).first()
            if row is not None:
                row.answer(certnames if names_ok else None, "" if names_ok else error)
                taken += 1
        return Response({"taken": taken})


class SyncsView(BridgeView):
    @extend_schema(request=dict, responses={201: dict})
    def post(self, request: Request) -> Response:
        body = request.data if isinstance(request.data, dict) else None
        if body is None:
            raise exceptions.ValidationError({"non_field_errors": ['A JSON object: {"facts": [...]}.']})
        try:
            paths = check_fact_paths(body.get("facts"))
        except PageError as exc:
            raise exceptions.ValidationError({"facts": [str(exc)]}) from None
        try:
            inventory = self.inventory(request).start_sync(paths)
        except Conflict as exc:
            raise ConflictProblem(str(exc)) from None
        return Response(
            {
                "id": str(inventory.sync_id),
                "full": inventory.sync_full,
                "since": None if inventory.sync_full else inventory.since,
                "page_max_nodes": settings.INVENTORY_PAGE_MAX_NODES,
                "page_max_bytes": settings.INVENTORY_PAGE_MAX_BYTES,
            },
            status=status.HTTP_201_CREATED,
        )


class SyncNodesView(BridgeView):
    parser_classes = [PageParser]

    @extend_schema(request=dict, responses={200: dict})
    def put(self, request: Request, pk: uuid.UUID) -> Response:
        inventory = self.inventory(request)
        try:
            current = inventory.current(pk)
            nodes, refused = check_page(request.data, current.fact_paths)
            stored = inventory.store(pk, nodes)
        except PageError as exc:
            raise exceptions.ValidationError({"nodes": [str(exc)]}) from None
        except Conflict as exc:
            raise ConflictProblem(str(exc)) from None
        return Response({"stored": stored, "refused": refused})


class SyncDoneView(BridgeView):
    @extend_schema(request=dict, responses={200: dict})
    def post(self, request: Request, pk: uuid.UUID) -> Response:
        body = request.data if isinstance(request.data, dict) else {}
        since, error = body.get("since"), body.get("error")
        inventory = self.inventory(request)
        try:
            if isinstance(error, str) and error:
                inventory.fail_sync(pk, error)
                return Response({"dropped": 0})
            if not isinstance(since, str) or not 0 < len(since) <= SINCE_CHARS or not _aware(since):
                raise exceptions.ValidationError(
                    {"since": ["PuppetDB's time the next sync asks from (ISO 8601), or give an error."]}
                )
            dropped = inventory.end_sync(pk, since)
        except Conflict as exc:
            raise ConflictProblem(str(exc)) from None
        return Response({"dropped": dropped})
