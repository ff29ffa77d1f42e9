"""Puppet runs that a workflow step asks for and a bridge works.

pending ──accept──▶ accepted ──▶ in-progress (heartbeats) ──▶ complete
   └───────────── cancel or expiry ─────────────────────────────▲

A rollout (Rollout, below) is a run this service works itself, in batches: its run is
`rolling-out` (`in-progress` on the wire) from the start until its last batch ends, and each
batch is an ordinary run of its own, which any bridge works unchanged. No bridge sees,
accepts or heartbeats a rollout's own run.

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
from runs import results
from runs.signals import run_changed


class Status(models.TextChoices):
    PENDING = "pending"
    ACCEPTED = "accepted"
    IN_PROGRESS = "in-progress"
    COMPLETE = "complete"
    ROLLING_OUT = "rolling-out"  # a rollout's own run, worked by this service (Rollout)


OPEN_STATES = (Status.PENDING, Status.ACCEPTED, Status.IN_PROGRESS)
HELD_STATES = (Status.ACCEPTED, Status.IN_PROGRESS)  # a bridge holds the lease


def wire_status(status: str) -> str:
    """The status as clients see it: the RFC's pending, in-progress or complete."""
    if status == Status.ACCEPTED:
        return Status.PENDING
    return Status.IN_PROGRESS if status == Status.ROLLING_OUT else status


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
    # A rollout's own run (its batches are ordinary runs): the API shows its progress.
    is_rollout = models.BooleanField(default=False)
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
        """The run `fields` (validated by RunCreateSerializer) ask for; with a `rollout`
        (its nodes and plan, from the serializer), a rollout's own run and its first batch."""
        if fields.get("rollout"):
            rest = {k: v for k, v in fields.items() if k != "rollout"}
            return Rollout.begin(connection, rest, fields["rollout"]["nodes"], fields["rollout"]["plan"])
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
        if self.is_rollout:
            doc["rollout"] = self.rollout.progress()
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
        if self.is_rollout:
            raise Conflict(ROLLOUT_IS_OURS)
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
        if self.is_rollout:
            raise Conflict(ROLLOUT_IS_OURS)
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
        bridge sees cancel_requested in every state answer); a rollout stops, and its batch
        in flight is cancelled so. Raises Conflict when complete."""
        if self.is_rollout and self.rollout.cancel(token_prefix):
            self.refresh_from_db()
            return
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

    def end_rollout(self, outcome: str, report: dict[str, Any], note: str) -> bool:
        """A rollout's own run completes with its report as run_results (stored when large,
        as a bridge's results are). Compare-and-set: False when it had ended already."""
        state = results.keep({"run_results": report})
        changes = {
            "status": Status.COMPLETE,
            "outcome": outcome,
            "run_results": state["run_results"],
            "results_size": state.get("results_size"),
            "results_sha256": state.get("results_sha256", ""),
        }
        return self._transition(Status.ROLLING_OUT, changes, "system", timezone.now(), note=note[:255])


ROLLOUT_IS_OURS = (
    "This run is a rollout: the service works it, in batches that are runs of their own; "
    "a bridge works those."
)


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


# Rollouts ------------------------------------------------------------------------------------


class RolloutState(models.TextChoices):
    RUNNING = "running"  # a batch's run is out
    PAUSED = "paused"  # between batches, until next_batch_at
    COMPLETE = "complete"


SUCCEEDED = "finished"  # a node's outcome when Puppet ran to a good end on it (every backend's word)
NOT_RUN = "not-run"  # a node of a batch that never started


class Rollout(models.Model):
    """A run worked in batches: the canary first, then `batch_size` nodes at a time, each
    batch an ordinary run with a `nodes` scope (RolloutBatch), `pause` seconds apart. It stops
    before the next batch when the canary failed anywhere, or when more nodes failed in all
    than `max_failures`. Its own run (`run`, `rolling-out`) completes with the report.

    running(k) ──end_batch──▶ paused(k) ──start_batch──▶ running(k+1) … ──▶ complete
    Each arrow a compare-and-set naming the state and the batch it leaves, so two workers
    that both see batch k end record it once and start batch k+1 once."""

    run = models.OneToOneField(Run, primary_key=True, on_delete=models.CASCADE, related_name="rollout")
    spec = models.JSONField()  # the rollout section as given: {canary, batch, max_failures, pause}
    nodes = models.JSONField()  # certnames, in the order they go
    canary = models.PositiveIntegerField()
    batch_size = models.PositiveIntegerField()
    max_failures = models.PositiveIntegerField()  # failed nodes allowed, in all
    pause = models.PositiveIntegerField()  # seconds between batches
    state = models.CharField(max_length=16, choices=RolloutState.choices, default=RolloutState.RUNNING)
    current = models.PositiveIntegerField(default=0)  # the batch running, or the last one run
    next_batch_at = models.DateTimeField(null=True, blank=True)
    nodes_done = models.PositiveIntegerField(default=0)
    nodes_failed = models.PositiveIntegerField(default=0)
    stop_reason = models.TextField(blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            # What the sweep looks at: the few rollouts not complete.
            models.Index(
                fields=["state"],
                name="runs_rollout_open_idx",
                condition=~models.Q(state=RolloutState.COMPLETE),
            )
        ]

    def __str__(self) -> str:
        return f"rollout {self.run_id}"

    # The plan: which nodes each batch takes -------------------------------------------------

    @property
    def batch_count(self) -> int:
        rest = len(self.nodes) - self.canary
        return (1 if self.canary else 0) + -(-rest // self.batch_size)

    def batch_nodes(self, index: int) -> list[str]:
        if self.canary:
            if index == 0:
                return self.nodes[: self.canary]
            start = self.canary + (index - 1) * self.batch_size
        else:
            start = index * self.batch_size
        return self.nodes[start : start + self.batch_size]

    def is_canary(self, index: int) -> bool:
        return bool(self.canary) and index == 0

    # Transitions ------------------------------------------------------------------------------

    @classmethod
    def begin(
        cls, connection: PuppetConnection, fields: dict[str, Any], nodes: list[str], plan: dict[str, Any]
    ) -> Run:
        """The rollout's own run, the rollout, and its first batch's run, in one transaction.
        `fields` are the run's (validated as POST /_puppet/runs validates them), `plan` the
        rollout's numbers (runs.rollouts.plan)."""
        now = timezone.now()
        with transaction.atomic():
            run = Run.objects.create(
                connection=connection,
                status=Status.ROLLING_OUT,
                is_rollout=True,
                created_at=now,
                updated_at=now,
                **fields,
            )
            rollout = cls.objects.create(run=run, nodes=nodes, updated_at=now, **plan)
            RunTransition.objects.create(
                run=run,
                at=now,
                from_status=Status.PENDING,
                to_status=Status.ROLLING_OUT,
                token_prefix="system",
                note=f"rollout: {len(nodes)} nodes in {rollout.batch_count} batches",
            )
            rollout._launch(0)
        return run

    def end_batch(self, index: int, outcomes: dict[str, str], why: str, now: datetime) -> bool:
        """Batch `index` ended, its nodes with `outcomes`: the rollout pauses before the next,
        or completes (the last batch, or failures over the budget). `why` says how the
        batch's run ended. False when another worker recorded it first."""
        failed = sorted(node for node, outcome in outcomes.items() if outcome != SUCCEEDED)
        nodes_failed = self.nodes_failed + len(failed)
        stop = ""
        if failed and self.is_canary(index):
            stop = f"The canary failed on {_names(failed)}{why}."
        elif nodes_failed > self.max_failures:
            stop = (
                f"{nodes_failed} nodes failed in all, over the budget of {self.max_failures}: "
                f"batch {index + 1} failed on {_names(failed)}{why}."
            )
        last = index + 1 >= self.batch_count
        changes: dict[str, Any] = {
            "nodes_done": self.nodes_done + len(outcomes),
            "nodes_failed": nodes_failed,
            "updated_at": now,
        }
        if stop or last:
            changes.update(state=RolloutState.COMPLETE, stop_reason=stop)
        else:
            changes.update(state=RolloutState.PAUSED, next_batch_at=now + timedelta(seconds=self.pause))
        with transaction.atomic():
            won = Rollout.objects.filter(pk=self.pk, state=RolloutState.RUNNING, current=index).update(
                **changes
            )
            if not won:
                return False  # another worker recorded this batch's end
            RolloutBatch.objects.filter(rollout=self, index=index).update(
                outcomes=outcomes, failed=len(failed), ended_at=now
            )
            for field, value in changes.items():
                setattr(self, field, value)
            if self.state == RolloutState.COMPLETE:
                outcome = Outcome.FAILED if (stop or nodes_failed) else Outcome.FINISHED
                self.run.end_rollout(outcome, self.report(), note=stop or "every batch ran")
            else:
                self._progressed(now)
        return True

    def start_batch(self, index: int, now: datetime) -> bool:
        """The pause after batch `index - 1` is over: batch `index`'s run is made, once. False
        when the pause is not over, or another worker started it."""
        with transaction.atomic():
            won = Rollout.objects.filter(
                pk=self.pk, state=RolloutState.PAUSED, current=index - 1, next_batch_at__lte=now
            ).update(state=RolloutState.RUNNING, current=index, next_batch_at=None, updated_at=now)
            if not won:
                return False
            self.state, self.current, self.next_batch_at, self.updated_at = (
                RolloutState.RUNNING,
                index,
                None,
                now,
            )
            self._launch(index)
            self._progressed(now)
        return True

    def cancel(self, token_prefix: str) -> bool:
        """Stop before any further batch, and cancel the one in flight (its run's own
        cancel). False when the rollout had ended already."""
        now = timezone.now()
        reason = f"Cancelled ({token_prefix})."
        with transaction.atomic():
            won = (
                Rollout.objects.filter(pk=self.pk)
                .exclude(state=RolloutState.COMPLETE)
                .update(state=RolloutState.COMPLETE, stop_reason=reason, next_batch_at=None, updated_at=now)
            )
            if not won:
                return False
            self.refresh_from_db()
            batch = (
                self.batches.filter(index=self.current, ended_at__isnull=True).select_related("run").first()
            )
            if batch is not None:
                try:
                    batch.run.cancel(token_prefix)
                except Conflict:
                    pass  # it ended just now
            self.run.end_rollout(Outcome.CANCELLED, self.report(), note=reason)
        return True

    def _progressed(self, now: datetime) -> None:
        """The rollout's run was updated now (its state's `updated_at`), and whoever follows
        it (a workflow step) looks again, once this commits."""
        Run.objects.filter(pk=self.run_id).update(updated_at=now)
        self.run.updated_at = now
        self.run._changed()

    def _launch(self, index: int) -> None:
        parent = self.run
        batch = Run.create_for(
            parent.connection,
            {
                "type": RunType.RUN,
                "environment": parent.environment,
                "scope": {"nodes": self.batch_nodes(index)},
                **{f: getattr(parent, f) for f in ("noop", "no_noop", "debug", "trace", "evaltrace")},
            },
        )
        # Unique (rollout, index): were the compare-and-set ever bypassed, a second start of
        # the same batch fails here and its transaction (its run) goes with it.
        RolloutBatch.objects.create(rollout=self, index=index, run=batch)

    # What it shows ----------------------------------------------------------------------------

    def progress(self) -> dict[str, Any]:
        """Where it is, for the run's API: batch k of n, nodes done."""
        doc: dict[str, Any] = {
            "state": self.state,
            "batch": self.current + 1,
            "batches": self.batch_count,
            "canary": self.canary,
            "batch_size": self.batch_size,
            "nodes": len(self.nodes),
            "nodes_done": self.nodes_done,
            "nodes_failed": self.nodes_failed,
            "max_failures": self.max_failures,
        }
        if self.next_batch_at:
            doc["next_batch_at"] = _iso(self.next_batch_at)
        current = self.batches.filter(index=self.current).values_list("run_id", flat=True).first()
        if current:
            doc["batch_run"] = str(current)
        if self.stop_reason:
            doc["stopped"] = self.stop_reason
        return doc

    def report(self) -> dict[str, Any]:
        """Which batches ran, each node's outcome, and why it stopped: the rollout's run's
        results, and the puppet-run step's outputs."""
        batches = []
        nodes = dict.fromkeys(self.nodes, NOT_RUN)
        for batch in self.batches.order_by("index"):
            doc: dict[str, Any] = {
                "batch": batch.index + 1,
                "canary": self.is_canary(batch.index),
                "run": str(batch.run_id),
                "nodes": self.batch_nodes(batch.index),
            }
            if batch.ended_at is None:
                doc["outcome"] = "cancelled" if self.state == RolloutState.COMPLETE else "running"
            else:
                doc["outcome"] = SUCCEEDED if not batch.failed else Outcome.FAILED.value
                doc["failed"] = sorted(n for n, o in batch.outcomes.items() if o != SUCCEEDED)
                nodes.update(batch.outcomes)
            batches.append(doc)
        return {
            "batches": batches,
            "nodes": nodes,
            "stopped": self.stop_reason,
            "nodes_failed": self.nodes_failed,
            "max_failures": self.max_failures,
        }


class RolloutBatch(models.Model):
    """One batch of a rollout: its run (an ordinary one, scope `nodes`), and once it ended
    each node's outcome."""

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="batches")
    index = models.PositiveIntegerField()
    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="rollout_batch")
    outcomes = models.JSONField(null=True, blank=True)  # certname -> its outcome
    failed = models.PositiveIntegerField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["rollout", "index"]
        constraints = [models.UniqueConstraint(fields=["rollout", "index"], name="runs_rollout_batch_once")]

    def __str__(self) -> str:
        return f"batch {self.index + 1} of {self.rollout_id}"


def _names(nodes: list[str], most: int = 5) -> str:
    shown = ", ".join(nodes[:most])
    return shown + (f" and {len(nodes) - most} more" if len(nodes) > most else "")
