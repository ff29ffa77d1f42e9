"""Puppet runs that a workflow step asks for and a bridge works.

pending ──accept──▶ accepted ──▶ in-progress (heartbeats) ──▶ complete
   └───────────── cancel or expiry ─────────────────────────────▲

Every change of status is a compare-and-set UPDATE that names the status it leaves, so two
racing clients can never both win; each is recorded as a RunTransition.

`accepted` is this service's own record of the accept (and its lease). On the wire a run
has the RFC's three statuses only: an accepted run shows `pending` (with `accepted_at`)
until its bridge reports it in progress, because the shipped bridge's state model knows no
other and the shipped `run-start` step waits while the status is `pending`.
"""

import functools
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection as db_connection
from django.db import models, transaction
from django.utils import timezone

from puppet_connection.models import PuppetConnection
from runs.signals import run_changed


class Status(models.TextChoices):
    PENDING = "pending"
    ACCEPTED = "accepted"
    IN_PROGRESS = "in-progress"
    COMPLETE = "complete"


OPEN_STATES = (Status.PENDING, Status.ACCEPTED, Status.IN_PROGRESS)
HELD_STATES = (Status.ACCEPTED, Status.IN_PROGRESS)  # a bridge holds the lease


def wire_status(status: str) -> str:
    """The status as clients see it: the RFC's pending, in-progress or complete."""
    return Status.PENDING if status == Status.ACCEPTED else status


class Outcome(models.TextChoices):
    FINISHED = "finished"
    FAILED = "failed"
    ERROR = "error"
    SUCCESS = "success"  # plans
    FAILURE = "failure"  # plans
    CANCELLED = "cancelled"
    TIMED_OUT = "timed-out"


# What a bridge may report; `cancelled` only after a cancel was requested.
CLIENT_OUTCOMES = [o.value for o in Outcome if o != Outcome.TIMED_OUT]


class RunType(models.TextChoices):
    RUN = "run"
    TASK_RUN = "task-run"
    PLAN_RUN = "plan-run"


# Task runs made before task runs had a scope, kept as they were: certnames as `targets`,
# no scope. Only this service's own bridge can work them; the shipped Ruby
# agent exits on a task run without a scope (MissingScopeError), so it is never shown one.
OLD_TASK_RUNS = models.Q(type=RunType.TASK_RUN, scope={})


def offered(now: datetime, to_our_bridge: bool) -> models.Q:
    """The runs `GET _puppet/runs` offers as `pending`: those nobody holds. To a client that is
    not our bridge (the shipped Ruby agent) also an accepted run not started whose bridge has
    said nothing for RUN_REOFFER_AFTER seconds: the agent takes such a run back by its stamp
    file, with no second accept, when it was restarted (it exits on any error listing runs,
    and its unit starts it again); a live agent PUTs every 15 s while it starts a run, so it
    is never offered one it is still starting. Our bridge finds its runs in its state_dir."""
    nobody = models.Q(status=Status.PENDING)
    if to_our_bridge:
        return nobody
    silent = now - timedelta(seconds=settings.RUN_REOFFER_AFTER)
    return nobody | models.Q(status=Status.ACCEPTED, updated_at__lt=silent)


class Conflict(Exception):
    """The request does not fit the run's current state; the message says why."""


class Run(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    connection = models.ForeignKey(PuppetConnection, on_delete=models.CASCADE, related_name="runs")
    type = models.CharField(max_length=16, choices=RunType.choices, default=RunType.RUN)
    environment = models.CharField(max_length=255, blank=True)
    scope = models.JSONField(default=dict, blank=True)
    noop = models.BooleanField(default=False)
    no_noop = models.BooleanField(default=False)
    debug = models.BooleanField(default=False)
    trace = models.BooleanField(default=False)
    evaltrace = models.BooleanField(default=False)
    name = models.CharField(max_length=255, blank=True)  # task or plan
    params = models.JSONField(null=True, blank=True)  # task or plan
    targets = models.JSONField(null=True, blank=True)  # task

    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    lease_id = models.UUIDField(null=True, blank=True)
    accepted_at = models.DateTimeField(null=True, blank=True)
    job_id = models.CharField(max_length=255, blank=True)
    next_update_before = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, blank=True)
    # Results over RUN_RESULTS_MAX_BYTES are kept whole in the events storage (runs.results);
    # run_results then holds their summary, and these say which object holds them.
    run_results = models.JSONField(null=True, blank=True)
    results_size = models.BigIntegerField(null=True, blank=True)
    results_sha256 = models.CharField(max_length=64, blank=True)
    cancel_requested = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            models.Index(fields=["connection", "status", "created_at"]),
            # The open runs, for the expiry sweep (expire_runs): a few among many complete
            # ones, so their status alone finds them. No index holds a column a heartbeat
            # writes (updated_at, next_update_before, job_id): then PostgreSQL updates the
            # row in place on its page (a HOT update, with the table's fillfactor leaving
            # room: migration 0003) and touches no index at all.
            models.Index(
                fields=["status"], name="runs_run_open_idx", condition=models.Q(status__in=OPEN_STATES)
            ),
        ]

    def __str__(self) -> str:
        return f"{self.type} {self.id}"

    @classmethod
    def create_for(cls, connection: PuppetConnection, fields: dict[str, Any]) -> "Run":
        with transaction.atomic():
            run = cls.objects.create(connection=connection, **fields)
            notify_new_run(connection.pk)
        return run

    def to_dict(self) -> dict[str, Any]:
        """The run as the API shows it, with the fields of its type only."""
        doc: dict[str, Any] = {
            "id": str(self.id),
            "type": self.type,
            "state": self.state,
            "noop": self.noop,
            "no_noop": self.no_noop,
            "debug": self.debug,
            "trace": self.trace,
            "evaltrace": self.evaltrace,
            "created_at": _iso(self.created_at),
        }
        if self.environment:
            # Left out when there is none, not null: the shipped agent then takes its own
            # Puppet[:environment], where a null became `--environment ''` on its Bolt backend.
            doc["environment"] = self.environment
        if self.type == RunType.RUN:
            doc["scope"] = self.scope
        else:
            doc.update(name=self.name, params=self.params)
            if self.type == RunType.TASK_RUN:
                # A task run made before scopes (OLD_TASK_RUNS) has certnames as targets and
                # no scope, as it always showed.
                if self.scope:
                    doc["scope"] = self.scope
                doc["targets"] = self.targets
        return doc

    @property
    def state(self) -> dict[str, Any]:
        """The state document of the RFC: what GET shows and every state PUT answers.
        Empty values are left out, as the shipped bridge expects."""
        state: dict[str, Any] = {"status": wire_status(self.status), "updated_at": _iso(self.updated_at)}
        if self.accepted_at:
            state["accepted_at"] = _iso(self.accepted_at)
        if self.outcome:
            state["outcome"] = self.outcome
        if self.run_results is not None:
            state["run_results"] = self.run_results
        if self.results_sha256:
            state["run_results_stored"] = {
                "size": self.results_size,
                "sha256": self.results_sha256,
                "url": f"{settings.RELAY_PUBLIC_URL}/_puppet/runs/{self.id}/results",
            }
        if self.job_id:
            state["job_id"] = self.job_id
        if self.next_update_before and self.status == Status.IN_PROGRESS:
            state["next_update_before"] = _iso(self.next_update_before)
        if self.cancel_requested:
            state["cancel_requested"] = True
        return state

    def _transition(
        self,
        old: str,
        changes: dict[str, Any],
        token_prefix: str,
        now: datetime,
        note: str = "",
        still: models.Q | None = None,
    ) -> bool:
        """Compare-and-set from status `old` (and the condition `still`, re-checked in the same
        UPDATE); records the transition when it wins."""
        with transaction.atomic():
            won = Run.objects.filter(still or models.Q(), pk=self.pk, status=old).update(
                updated_at=now, **changes
            )
            if won:
                RunTransition.objects.create(
                    run_id=self.pk,
                    at=now,
                    from_status=old,
                    to_status=changes.get("status", old),
                    token_prefix=token_prefix,
                    note=note,
                )
                self._changed()
        if won:
            for field, value in {"updated_at": now, **changes}.items():
                setattr(self, field, value)
        return bool(won)

    def accept(self, lease_id: uuid.UUID | None, token_prefix: str) -> uuid.UUID:
        """Take the run, exactly once. Returns the lease id.

        Repeating the accept with the lease id that won is answered as a success, so a client
        whose first answer was lost does not take its own accept for someone else's."""
        lease = lease_id or uuid.uuid4()
        now = timezone.now()
        changes = {"status": Status.ACCEPTED, "lease_id": lease, "accepted_at": now}
        if self._transition(Status.PENDING, changes, token_prefix, now):
            return lease
        self.refresh_from_db()
        if lease_id is not None and self.lease_id == lease_id and self.status in HELD_STATES:
            return lease_id
        raise Conflict(f"The run is {self.status}; it was accepted already.")

    @classmethod
    def update_state_of(
        cls, connection: PuppetConnection, run_id: uuid.UUID, data: dict[str, Any], token_prefix: str
    ) -> "Run":
        """Apply a bridge's state PUT (validated by StateSerializer) to this connection's run.
        Raises Run.DoesNotExist or Conflict.

        A heartbeat that changes no status is the hot path (every bridge, every 15 s): one
        compare-and-set UPDATE. Anything else takes the row lock and checks the rules."""
        now = timezone.now()
        run = cls._heartbeat(connection, run_id, data, now)
        if run is not None:
            return run
        with transaction.atomic():
            run = cls.objects.select_for_update().get(pk=run_id, connection=connection)
            run._apply_state(data, token_prefix, now)
        return run

    @classmethod
    def _heartbeat(
        cls, connection: PuppetConnection, run_id: uuid.UUID, data: dict[str, Any], now: datetime
    ) -> "Run | None":
        """The run after a plain heartbeat, or None when this PUT is not one (or the run is
        not in a state where it could be): the caller then takes the careful path."""
        rule = heartbeat_rule(data)
        if rule is None:
            return None
        held, changes = rule
        where = models.Q(pk=run_id, connection=connection, status__in=held)
        if data.get("lease_id") is not None:
            where &= models.Q(lease_id=data["lease_id"])
        return _update_returning(where, {"updated_at": now, **changes})

    def _apply_state(self, data: dict[str, Any], token_prefix: str, now: datetime) -> None:
        status = data["status"]
        if self.status == Status.PENDING:
            raise Conflict("The run has not been accepted; accept it before reporting its state.")
        lease_id = data.get("lease_id")
        if lease_id is not None and lease_id != self.lease_id:
            raise Conflict("The lease id does not match: another bridge holds this run.")
        if self.status == Status.COMPLETE:
            if status == Status.COMPLETE and self._same_completion(data):
                return  # a repeated final PUT (its answer was lost): same answer again
            raise Conflict(f"The run is complete ({self.outcome}); its state cannot change.")

        changes: dict[str, Any] = {}
        if data.get("job_id"):
            changes["job_id"] = data["job_id"]
        if status == Status.IN_PROGRESS:
            changes.update(status=Status.IN_PROGRESS, next_update_before=data["next_update_before"])
        elif status == Status.COMPLETE:
            outcome = data.get("outcome") or Outcome.FINISHED
            if outcome == Outcome.CANCELLED and not self.cancel_requested:
                raise Conflict("Outcome 'cancelled' is only for runs whose cancel was requested.")
            changes.update(
                status=Status.COMPLETE,
                outcome=outcome,
                run_results=data.get("run_results"),
                results_size=data.get("results_size"),
                results_sha256=data.get("results_sha256", ""),
            )
        # `pending` or `accepted` after the accept: a plain heartbeat (the shipped agent
        # sends `pending` once right after accepting).

        old = self.status
        changes["updated_at"] = now
        Run.objects.filter(pk=self.pk).update(**changes)
        for field, value in changes.items():
            setattr(self, field, value)
        if self.status != old:
            RunTransition.objects.create(
                run_id=self.pk, at=now, from_status=old, to_status=self.status, token_prefix=token_prefix
            )
            self._changed()

    def _changed(self) -> None:
        """Tell listeners (a workflow step waiting on this run) once the change commits."""
        transaction.on_commit(lambda: run_changed.send(sender=Run, run=self))

    def _same_completion(self, data: dict[str, Any]) -> bool:
        return (
            (data.get("outcome") or Outcome.FINISHED) == self.outcome
            and data.get("run_results") == self.run_results
            and data.get("results_sha256", "") == self.results_sha256
            and (not data.get("job_id") or data["job_id"] == self.job_id)
        )

    def cancel(self, token_prefix: str) -> None:
        """A pending run completes `cancelled` at once; a held run is asked to stop (its
        bridge sees cancel_requested in every state answer). Raises Conflict when complete."""
        now = timezone.now()
        changes = {"status": Status.COMPLETE, "outcome": Outcome.CANCELLED}
        if self._transition(Status.PENDING, changes, token_prefix, now, note="cancelled before accept"):
            return
        # Lost to an accept, or held already: ask the bridge.
        for held in HELD_STATES:
            if Run.objects.filter(pk=self.pk, status=held).update(cancel_requested=True, updated_at=now):
                RunTransition.objects.create(
                    run_id=self.pk,
                    at=now,
                    from_status=held,
                    to_status=held,
                    token_prefix=token_prefix,
                    note="cancel requested",
                )
                self.refresh_from_db()
                return
        self.refresh_from_db()
        if self.outcome != Outcome.CANCELLED:
            raise Conflict(f"The run is complete ({self.outcome}); there is nothing to cancel.")


class RunTransition(models.Model):
    """When a run changed status, from what to what, and by which token (its visible prefix;
    `system` for expiry, `staff:<user>` for the admin)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="transitions")
    at = models.DateTimeField()
    from_status = models.CharField(max_length=16, choices=Status.choices)
    to_status = models.CharField(max_length=16, choices=Status.choices)
    token_prefix = models.CharField(max_length=64)
    note = models.CharField(max_length=255, blank=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.from_status} → {self.to_status}"


STATE_FIELDS = [
    "id",
    "status",
    "updated_at",
    "accepted_at",
    "outcome",
    "run_results",
    "results_size",
    "results_sha256",
    "job_id",
    "next_update_before",
    "cancel_requested",
]


def heartbeat_rule(data: dict[str, Any]) -> tuple[list[str], dict[str, Any]] | None:
    """Whether a state PUT (validated by StateSerializer) is a plain heartbeat, and if so the
    statuses the run must be in for it to be one and what it changes besides `updated_at`.
    None: the PUT changes the status and takes the careful path (Run._apply_state).

    `in-progress` is a heartbeat only for a run in progress (from `accepted` it is the start);
    `pending` or `accepted` is one for any run its bridge holds."""
    status = data["status"]
    if status == Status.IN_PROGRESS:
        held, changes = [Status.IN_PROGRESS], {"next_update_before": data["next_update_before"]}
    elif status in (Status.PENDING, Status.ACCEPTED):
        held, changes = list(HELD_STATES), {}
    else:
        return None
    if data.get("job_id"):
        changes["job_id"] = data["job_id"]
    return held, changes


@functools.cache
def heartbeat_sql() -> str:
    """The heartbeat as one statement for the asynchronous path (runs/api/fast.py), which
    has not been through the token authentication: besides heartbeat_rule's conditions
    (status, lease), it re-checks the connection's token against the row as it is now (the
    digest the caller verified, the newest pepper, an active owner) and that the ordinary path
    has nothing to write on the connection (last use within TOKEN_LAST_USED_RESOLUTION, the
    platform and backend headers as recorded: reported_platform and reported_backend, which
    note_bridge writes; a request never writes the settings). When any fails there is no
    row, and the caller hands the request to the ordinary path, which answers it in full.

    Parameters by name: run, connection, held (the statuses, at most two, as two parameters
    held_0 and held_1: psycopg's array adaptation was a twentieth of the heartbeat's CPU),
    lease, digest, pepper, used_since, platform, backend, now, next_update_before, job_id
    (None: unchanged)."""
    run, conn = Run._meta.db_table, PuppetConnection._meta.db_table
    user = PuppetConnection._meta.get_field("owner").related_model._meta.db_table
    columns = ", ".join(f"r.{Run._meta.get_field(name).column}" for name in STATE_FIELDS)
    # Table names from the models' metadata; every value is a parameter.
    return (
        f"UPDATE {run} AS r SET updated_at = %(now)s,"  # noqa: S608
        " next_update_before = COALESCE(%(next_update_before)s, r.next_update_before),"
        " job_id = COALESCE(%(job_id)s, r.job_id)"
        f" FROM {conn} AS c"
        " WHERE r.id = %(run)s AND r.connection_id = %(connection)s AND c.id = r.connection_id"
        " AND r.status IN (%(held_0)s, %(held_1)s)"
        " AND (%(lease)s::uuid IS NULL OR r.lease_id = %(lease)s::uuid)"
        " AND c.token_digest = %(digest)s AND c.token_pepper_id = %(pepper)s"
        " AND c.last_used > %(used_since)s"
        " AND (%(platform)s = '' OR c.reported_platform = %(platform)s)"
        " AND (%(backend)s = '' OR c.reported_backend = %(backend)s)"
        f" AND EXISTS (SELECT 1 FROM {user} AS u WHERE u.id = c.owner_id AND u.is_active)"
        f" RETURNING {columns}"
    )


def _update_returning(where: models.Q, changes: dict[str, Any]) -> Run | None:
    """UPDATE the one run matching `where` and read back its state in the same statement
    (PostgreSQL and SQLite both have RETURNING). None when no run matched."""
    query = Run.objects.filter(where).query
    compiler = query.get_compiler(using=Run.objects.db)
    where_sql, where_params = compiler.compile(query.where)
    fields = [Run._meta.get_field(name) for name in changes]
    sets = ", ".join(f"{db_connection.ops.quote_name(f.column)} = %s" for f in fields)
    values = [f.get_db_prep_save(changes[f.name], db_connection) for f in fields]
    columns = ", ".join(db_connection.ops.quote_name(Run._meta.get_field(n).column) for n in STATE_FIELDS)
    table = db_connection.ops.quote_name(Run._meta.db_table)
    # Every name is quoted from the model's metadata; every value is a parameter.
    sql = f"UPDATE {table} SET {sets} WHERE {where_sql} RETURNING {columns}"  # noqa: S608
    with db_connection.cursor() as cursor:
        cursor.execute(sql, [*values, *where_params])
        row = cursor.fetchone()
    if row is None:
        return None
    return Run(**{name: _from_db(name, value) for name, value in zip(STATE_FIELDS, row, strict=True)})


def _from_db(name: str, value: Any) -> Any:
    """What the ORM would have made of a raw column value (JSON, UUIDs, SQLite's dates)."""
    field = Run._meta.get_field(name)
    column = field.get_col(Run._meta.db_table)
    for convert in db_connection.ops.get_db_converters(column) + field.get_db_converters(db_connection):
        value = convert(value, column, db_connection)
    return value


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def notify_new_run(connection_id: uuid.UUID) -> None:
    """Wake bridges long-polling for this connection (runs.notify). On PostgreSQL, NOTIFY
    inside the transaction is delivered only when it commits, so a waiter never looks for a
    run that is not visible yet."""
    if db_connection.vendor == "postgresql":
        with db_connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [settings.RUNS_NOTIFY_CHANNEL, str(connection_id)])


def expire_runs(now: datetime) -> int:
    """Complete, with outcome `timed-out`, the runs nobody looks after any more:
    held runs whose heartbeat is overdue by RUN_HEARTBEAT_GRACE, accepted runs that never
    started within RUN_ACCEPTED_TIMEOUT, and pending runs nobody accepted within
    RUN_PENDING_TIMEOUT. Returns how many it completed."""
    grace = timedelta(seconds=settings.RUN_HEARTBEAT_GRACE)
    rules = [
        (
            Status.IN_PROGRESS,
            models.Q(next_update_before__lt=now - grace),
            "No heartbeat from the bridge: its next update was due before {due}.",
        ),
        (
            Status.ACCEPTED,
            models.Q(updated_at__lt=now - timedelta(seconds=settings.RUN_ACCEPTED_TIMEOUT)),
            "Accepted, but the bridge never reported the run in progress (last heard {last}).",
        ),
        (
            Status.PENDING,
            models.Q(created_at__lt=now - timedelta(seconds=settings.RUN_PENDING_TIMEOUT)),
            "No bridge accepted the run within {pending_timeout} seconds.",
        ),
    ]
    expired = 0
    for status, overdue, reason in rules:
        for run in Run.objects.filter(overdue, status=status).only(
            "id", "status", "next_update_before", "updated_at"
        )[:1000]:
            message = reason.format(
                due=_iso(run.next_update_before) if run.next_update_before else "",
                last=_iso(run.updated_at),
                pending_timeout=settings.RUN_PENDING_TIMEOUT,
            )
            changes = {
                "status": Status.COMPLETE,
                "outcome": Outcome.TIMED_OUT,
                "run_results": {"reason": message},
            }
            # `overdue` again in the UPDATE: a heartbeat may have arrived since the SELECT.
            expired += run._transition(status, changes, "system", now, note="expired", still=overdue)
    return expired
