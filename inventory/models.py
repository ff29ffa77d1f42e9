"""A connection's fleet as its bridge reads it from PuppetDB (issue 21 §3): one Node per
certname, and one Inventory per connection with where its syncs stand.

The bridge sends only what its allow-list (`inventory_facts`) names: the facts are kept as
the bridge sent them, flat, keyed by their dotted path (`{"os.family": "Debian"}`). A sync
is started, fed pages of nodes, and ended (inventory.api.views); `since` is PuppetDB's
time the next incremental sync asks from, and moves only when a sync ends well, so a sync
that fails half way loses nothing: the next one asks again from the same time."""

import hashlib
import json
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import models, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from puppet_connection.models import PuppetConnection


class ReportStatus(models.TextChoices):
    NONE = "", "no report"
    CHANGED = "changed", "changed"
    UNCHANGED = "unchanged", "unchanged"
    FAILED = "failed", "failed"


class State(models.TextChoices):
    """What a node is, as the scope preview and the filters say it."""

    ACTIVE = "active", "active"
    STALE = "stale", "stale"  # active, but no report for INVENTORY_STALE_AFTER
    DEACTIVATED = "deactivated", "deactivated"  # `puppet node deactivate`
    EXPIRED = "expired", "expired"  # PuppetDB's node-ttl


class Conflict(Exception):
    """A page or an end for a sync that is not the connection's current one."""


def stale_before() -> datetime:
    return timezone.now() - timedelta(seconds=settings.INVENTORY_STALE_AFTER)


def state_filter(state: str) -> Q:
    """The nodes in `state` (a State value)."""
    if state == State.DEACTIVATED:
        return Q(deactivated_at__isnull=False)
    if state == State.EXPIRED:
        return Q(expired_at__isnull=False, deactivated_at__isnull=True)
    inactive = Q(deactivated_at__isnull=False) | Q(expired_at__isnull=False)
    old = Q(report_at__lt=stale_before()) | Q(report_at__isnull=True)
    if state == State.STALE:
        return old & ~inactive
    return ~old & ~inactive


class Inventory(models.Model):
    """Where a connection's inventory syncs stand."""

    connection = models.OneToOneField(
        PuppetConnection, on_delete=models.CASCADE, primary_key=True, related_name="inventory"
    )
    # The facts the bridge's allow-list names, as its last sync said: the only facts the
    # inventory's filters take (a filter on another fact is a 400, not an empty page).
    fact_paths = models.JSONField(default=list, blank=True)
    # PuppetDB's time (its own clock, ISO 8601) the next incremental sync asks from; empty:
    # the next sync is a full one.
    since = models.CharField(max_length=64, blank=True)
    sync_id = models.UUIDField(null=True, blank=True, editable=False)  # the sync under way
    sync_full = models.BooleanField(default=False)
    sync_started_at = models.DateTimeField(null=True, blank=True)
    sync_touched_at = models.DateTimeField(null=True, blank=True)  # its last page
    synced_at = models.DateTimeField(null=True, blank=True)  # the last sync that ended well
    full_synced_at = models.DateTimeField(null=True, blank=True)
    sync_requested_at = models.DateTimeField(null=True, blank=True)  # "sync now", not yet done
    last_nodes = models.IntegerField(default=0)  # nodes the last sync sent
    last_error = models.TextField(blank=True)  # why the last sync failed (PuppetDB down, …)

    class Meta:
        verbose_name_plural = "inventories"

    def __str__(self) -> str:
        return f"inventory of {self.connection}"

    @classmethod
    def of(cls, connection: PuppetConnection) -> "Inventory":
        inventory, _ = cls.objects.get_or_create(connection=connection)
        return inventory

    def request_sync(self) -> None:
        """On demand: the bridge syncs at its next check (a `serve` bridge within a minute,
        a `poll --once` bridge at its next round)."""
        type(self).objects.filter(pk=self.pk).update(sync_requested_at=timezone.now())

    def due(self) -> bool:
        return self.sync_requested_at is not None or self.synced_at is None

    def start_sync(self, fact_paths: list[str]) -> "Inventory":
        """A new sync; Conflict while another is under way, unless that one has sent no
        page for INVENTORY_SYNC_IDLE (its bridge died: it is replaced, and its pages are
        refused from then on). Full when there was none, when the
        allow-list changed (every node's facts must be sent again, and facts no longer
        named dropped), and once every INVENTORY_FULL_SYNC_EVERY (it also drops the nodes
        PuppetDB purged, which an incremental sync cannot see)."""
        with transaction.atomic():
            inventory = type(self).objects.select_for_update().get(pk=self.pk)
            now = timezone.now()
            idle = now - timedelta(seconds=settings.INVENTORY_SYNC_IDLE)
            if inventory.sync_id and inventory.sync_touched_at and inventory.sync_touched_at > idle:
                # One sync at a time: a `poll --once` that comes while a long full sync is
                # sent (or a second bridge host) must not start again and undo it.
                raise Conflict(
                    f"A sync is under way (its last page at {inventory.sync_touched_at.isoformat()}): "
                    f"try again once it ends, or after {settings.INVENTORY_SYNC_IDLE} s without a page."
                )
            old = now - timedelta(seconds=settings.INVENTORY_FULL_SYNC_EVERY)
            inventory.sync_full = (
                not inventory.since
                or inventory.fact_paths != fact_paths
                or inventory.full_synced_at is None
                or inventory.full_synced_at < old
            )
            inventory.fact_paths = fact_paths
            inventory.sync_id = uuid.uuid4()
            inventory.sync_started_at = inventory.sync_touched_at = now
            inventory.last_nodes = 0
            inventory.save()
        return inventory

    def current(self, sync_id: uuid.UUID) -> "Inventory":
        """This connection's inventory, if `sync_id` is the sync under way; else Conflict."""
        inventory = type(self).objects.get(pk=self.pk)
        if inventory.sync_id != sync_id:
            raise Conflict("This is not the sync under way: another one started since. Start again.")
        return inventory

    def store(self, sync_id: uuid.UUID, nodes: list[dict[str, Any]]) -> int:
        """Upsert one page of checked nodes (inventory.sync.check_page)."""
        inventory = self.current(sync_id)
        now = timezone.now()
        rows = [Node(connection_id=self.pk, seen_at=now, **node) for node in nodes]
        with transaction.atomic():
            Node.objects.bulk_create(
                rows,
                update_conflicts=True,
                unique_fields=["connection", "certname"],
                update_fields=[*Node.SENT, "seen_at"],
            )
            type(self).objects.filter(pk=self.pk, sync_id=inventory.sync_id).update(
                last_nodes=models.F("last_nodes") + len(rows), sync_touched_at=now
            )
        return len(rows)

    def end_sync(self, sync_id: uuid.UUID, since: str) -> int:
        """The sync ended well: `since` moves on, an on-demand request made before it began
        is met, and a full sync drops the nodes it did not send (PuppetDB has none of them
        any more). Returns how many were dropped."""
        with transaction.atomic():
            inventory = type(self).objects.select_for_update().get(pk=self.pk)
            if inventory.sync_id != sync_id:
                raise Conflict("This is not the sync under way: another one started since.")
            dropped = 0
            if inventory.sync_full:
                stale = Node.objects.filter(connection_id=self.pk, seen_at__lt=inventory.sync_started_at)
                dropped, _ = stale.delete()
                inventory.full_synced_at = inventory.sync_started_at
            requested = inventory.sync_requested_at
            if requested is not None and requested <= inventory.sync_started_at:
                inventory.sync_requested_at = None
            inventory.since = since
            inventory.synced_at = timezone.now()
            inventory.sync_id = None
            inventory.last_error = ""
            inventory.save()
        return dropped

    def fail_sync(self, sync_id: uuid.UUID, error: str) -> None:
        """The bridge could not finish (PuppetDB down, a query refused): `since` stays, so
        the next sync asks for everything this one would have sent."""
        updated = (
            type(self)
            .objects.filter(pk=self.pk, sync_id=sync_id)
            .update(sync_id=None, last_error=error[:2000])
        )
        if not updated:
            raise Conflict("This is not the sync under way: another one started since.")


class Node(models.Model):
    """One certname of a connection's PuppetDB."""

    connection = models.ForeignKey(PuppetConnection, on_delete=models.CASCADE, related_name="nodes")
    certname = models.CharField(max_length=255)
    environment = models.CharField(max_length=255, blank=True)
    report_status = models.CharField(max_length=16, choices=ReportStatus.choices, blank=True)
    report_at = models.DateTimeField(null=True, blank=True)  # the last report's end time
    facts_at = models.DateTimeField(null=True, blank=True)
    deactivated_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    facts = models.JSONField(default=dict, blank=True)  # the allow-list's, by dotted path
    seen_at = models.DateTimeField()  # the sync that last sent it

    # What a sync sends, and an upsert writes.
    SENT = ("environment", "report_status", "report_at", "facts_at", "deactivated_at", "expired_at", "facts")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["connection", "certname"], name="unique_node_per_connection")
        ]
        indexes = [models.Index(fields=["connection", "report_status"], name="node_status")]

    def __str__(self) -> str:
        return self.certname

    @property
    def state(self) -> str:
        if self.deactivated_at:
            return State.DEACTIVATED
        if self.expired_at:
            return State.EXPIRED
        if self.report_at is None or self.report_at < stale_before():
            return State.STALE
        return State.ACTIVE

    def to_dict(self) -> dict[str, Any]:
        def when(moment: datetime | None) -> str | None:
            return moment.isoformat() if moment else None

        return {
            "certname": self.certname,
            "state": self.state,
            "environment": self.environment,
            "report_status": self.report_status or None,
            "report_at": when(self.report_at),
            "facts_at": when(self.facts_at),
            "deactivated_at": when(self.deactivated_at),
            "expired_at": when(self.expired_at),
            "facts": self.facts,
        }


class PreviewQuery(models.Model):
    """A `query` scope a preview asked about: the service has no PuppetDB, so the bridge
    resolves it at its next check (GET /_puppet/inventory lists the ones waiting) and
    answers its certnames, or PuppetDB's error. An answer is used for INVENTORY_QUERY_FRESH
    seconds; an older one is asked again."""

    connection = models.ForeignKey(PuppetConnection, on_delete=models.CASCADE, related_name="preview_queries")
    key = models.CharField(max_length=64)  # sha256 of the query's canonical JSON
    query = models.JSONField()
    asked_at = models.DateTimeField()
    answered_at = models.DateTimeField(null=True, blank=True)
    certnames = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["connection", "key"], name="unique_preview_query")]

    def __str__(self) -> str:
        return f"preview query {self.key[:12]}"

    @staticmethod
    def key_of(query: Any) -> str:
        return hashlib.sha256(json.dumps(query, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    @property
    def fresh(self) -> bool:
        old = timezone.now() - timedelta(seconds=settings.INVENTORY_QUERY_FRESH)
        return self.answered_at is not None and self.answered_at >= old

    @classmethod
    def ask(cls, connection: PuppetConnection, query: Any) -> "PreviewQuery":
        """The query's row; asked (again) unless it has a fresh answer or is waiting for one."""
        row, created = cls.objects.get_or_create(
            connection=connection,
            key=cls.key_of(query),
            defaults={"query": query, "asked_at": timezone.now()},
        )
        if not created and row.answered_at is not None and not row.fresh:
            cls.objects.filter(pk=row.pk).update(asked_at=timezone.now(), answered_at=None)
            row.refresh_from_db()
        return row

    @classmethod
    def waiting(cls, connection: PuppetConnection) -> QuerySet["PreviewQuery"]:
        return cls.objects.filter(connection=connection, answered_at__isnull=True).order_by("asked_at")

    def answer(self, certnames: list[str] | None, error: str) -> None:
        type(self).objects.filter(pk=self.pk, answered_at__isnull=True).update(
            answered_at=timezone.now(), certnames=certnames, error=error[:2000]
        )
