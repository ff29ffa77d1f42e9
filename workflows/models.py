import json
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection as db_connection
from django.db import models, transaction
from django.db.models.fields.json import KeyTransform
from django.db.models.signals import post_delete
from django.dispatch import receiver
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables

from connections.models import name_validator
from relay import rows, vault
from relay.tokens import PlainToken
from scriptsteps.masking import MASK  # hidden outputs show as the log's mark for a secret
from workflows.dialect import cron, validate, yamlload
from workflows.dialect.problems import DocumentError, child_pointer
from workflows.dialect.workflow import Trigger as ParsedTrigger
from workflows.dialect.workflow import Workflow as ParsedWorkflow

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NewTrigger:
    """A push or webhook trigger a revision made, with its token: shown once, in the answer
    that saved the revision (the token is kept nowhere else but Vault)."""

    name: str
    kind: str  # push or webhook
    token: PlainToken
    url: str = ""  # a webhook trigger's: where its events go

    def as_dict(self) -> dict[str, str]:
        shown = {"name": self.name, "type": self.kind, "token": str(self.token)}
        if self.url:
            shown["url"] = self.url
        return shown


class Workflow(models.Model):
    """A user's workflow: a name, and the revisions of its document (the newest is current)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="workflows")
    name = models.CharField(max_length=64, validators=[name_validator])
    description = models.TextField(blank=True, max_length=2000)
    created = models.DateTimeField(default=timezone.now, editable=False)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["owner_id", "name"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="unique_workflow_name_per_owner")
        ]

    def __str__(self) -> str:
        return self.name

    def latest_revision(self) -> "WorkflowRevision | None":
        return self.revisions.order_by("-number").first()

    def add_revision(self, source: str, user: object | None) -> "WorkflowRevision":
        """Saves `source`, verbatim, as the next revision, and the workflow's triggers with
        it (sync_token_triggers, sync_schedules). Raises DocumentError (with the problems and
        their places) when it is not a valid workflow, and VaultUnavailable when a new
        trigger's token cannot be kept (nothing is saved then). The new triggers' tokens are
        on the returned revision's `new_triggers`, on that object only."""
        document = validate.parse(source)
        _check_trigger_names(source, document)
        with transaction.atomic():
            # The row lock serialises two saves of one workflow, so their numbers differ.
            self.updated = timezone.now()
            Workflow.objects.select_for_update().filter(pk=self.pk).update(updated=self.updated)
            last = self.revisions.aggregate(last=models.Max("number"))["last"] or 0
            revision = self.revisions.create(number=last + 1, source=source, created_by=user)
            revision.new_triggers = self.sync_token_triggers(document)
            had = self.schedule_names()
            self.sync_schedules(document)
            # Last, under the owner's row lock (taken after the rows above, as the engine
            # takes it after a schedule's or an event's): two saves at once count in turn.
            lock_owner(self.owner_id)
            problems = self.owner_schedule_problems(self.owner_id, source, document, had)
            if problems:
                raise DocumentError(problems)
            return revision

    def schedule_names(self) -> set[str]:
        from triggers.models import Schedule

        return set(Schedule.objects.filter(workflow_id=self.pk).values_list("name", flat=True))

    def owner_schedule_problems(
        self, owner_id: Any, source: str, document: ParsedWorkflow, had: set[str]
    ) -> list[Any]:
        """Whether saving `document` here leaves `owner_id` with more than SCHEDULES_PER_OWNER
        schedule triggers across their workflows: the problem at the first schedule past
        them, or none. `had`: the names of the workflow's schedules before. A document that
        adds no schedule is never refused (an owner past a lowered budget may still save)."""
        from triggers.models import Schedule

        mine = [trigger for trigger in document.triggers if trigger.kind == "schedule"]
        if all(trigger.name in had for trigger in mine):
            return []
        others = Schedule.objects.filter(workflow__owner_id=owner_id)
        if self.pk:
            others = others.exclude(workflow_id=self.pk)
        most, elsewhere = settings.SCHEDULES_PER_OWNER, others.count()
        room = max(most - elsewhere, 0)
        if len(mine) <= room:
            return []
        return [
            yamlload.load(source).problem(
                mine[room].pointer,
                f"An owner has at most {most} schedule triggers across their workflows "
                f"(SCHEDULES_PER_OWNER); with this document there would be {elsewhere + len(mine)}.",
            )
        ]

    def hand_over(self, owner: Any) -> None:
        """Make `owner` the workflow's owner (a superuser's decision: workflows.permissions).
        Its push and webhook triggers follow it with new tokens, which no one is shown (the
        new owner regenerates one to copy): whoever held the old ones, the previous owner
        among them, could otherwise start runs that run with the new owner's connections. A
        trigger's Slack webhook goes too: it was the previous owner's channel."""
        with transaction.atomic():
            Workflow.objects.select_for_update().filter(pk=self.pk).update(owner=owner)
            self.owner = owner
            for trigger in self.push_triggers.select_for_update():
                trigger.owner = owner
                trigger.issue_token()
                if trigger.has_slack_webhook:
                    trigger.set_slack_webhook("")
        log.info("workflow %s handed over to user %s", self.pk, owner.pk)

    def sync_token_triggers(self, document: ParsedWorkflow) -> tuple[NewTrigger, ...]:
        """Make the push and webhook triggers (triggers.Trigger) the document declares and
        this workflow has not, each with a new token; delete those it no longer declares
        (their tokens stop working, their events go). A name kept with its kind keeps its
        trigger, token and filters; a name whose kind changed is a new trigger. Returns the
        new ones. Call under the workflow's row lock (add_revision takes it)."""
        from triggers.models import Trigger

        wanted = {t.name: t for t in document.triggers if t.kind in ("push", "webhook")}
        current = {trigger.name: trigger for trigger in Trigger.objects.filter(workflow=self)}
        for name, trigger in list(current.items()):
            spec = wanted.get(name)
            if spec is None or spec.kind != trigger.kind:
                trigger.delete()
                del current[name]
                log.info("%s trigger %s of workflow %s deleted", trigger.kind, trigger.pk, self.pk)
            elif spec.kind == "webhook" and trigger.image != _image(spec):
                Trigger.objects.filter(pk=trigger.pk).update(image=_image(spec))
        made = []
        for name, spec in wanted.items():
            if name not in current:
                trigger, token = Trigger.create_with_token(
                    owner=self.owner,
                    workflow=self,
                    name=name,
                    kind=spec.kind,
                    image=_image(spec),
                    description=f"{spec.kind.capitalize()} trigger {name!r} of workflow {self.name!r}.",
                )
                made.append(NewTrigger(name, spec.kind, token, trigger.webhook_url()))
        return tuple(made)

    def sync_schedules(self, document: ParsedWorkflow) -> None:
        """Make, change and delete the workflow's schedules (triggers.Schedule) as the
        document declares them. A schedule kept as written keeps its next time; a new or
        changed one is next due at its first time after now (never at once). Call under the
        workflow's row lock (add_revision takes it)."""
        from triggers.models import Schedule

        now = timezone.now()
        wanted = {t.name: t.schedule for t in document.triggers if t.kind == "schedule"}
        for schedule in Schedule.objects.filter(workflow=self):
            text = wanted.pop(schedule.name, None)
            if text is None:
                schedule.delete()
            elif text != schedule.schedule:
                schedule.schedule = text
                schedule.next_due = cron.parse(text).next_after(now)
                schedule.save(update_fields=["schedule", "next_due"])
        for name, text in wanted.items():
            Schedule.objects.create(
                workflow=self, name=name, schedule=text, next_due=cron.parse(text).next_after(now)
            )


def lock_owner(owner_id: Any) -> None:
    """Lock a user's row until the transaction ends: what counts an owner's budgets (their
    schedules, their runs in progress) and adds to them does so one at a time. Take it after
    any other row lock, so that no two transactions wait for each other."""
    from django.contrib.auth import get_user_model

    # FOR NO KEY UPDATE: lockers wait for each other, while rows that refer to the user (a
    # run's created_by, a trigger's owner) are still checked without waiting for it.
    users = get_user_model().objects.select_for_update(no_key=True)
    list(users.filter(pk=owner_id).values_list("pk", flat=True))


def _image(spec: "ParsedTrigger") -> str:
    return spec.container.image if spec.container is not None else ""


def _check_trigger_names(source: str, document: ParsedWorkflow) -> None:
    """A trigger is a row here, named as in the document: its name must fit the row."""
    from triggers.models import Schedule, Trigger

    longest = {
        "push": Trigger._meta.get_field("name").max_length,
        "webhook": Trigger._meta.get_field("name").max_length,
        "schedule": Schedule._meta.get_field("name").max_length,
    }
    too_long = [t for t in document.triggers if len(t.name) > longest[t.kind]]
    if too_long:
        loaded = yamlload.load(source)
        raise DocumentError(
            [
                loaded.problem(
                    child_pointer(trigger.pointer, "name"),
                    f"A {trigger.kind} trigger's name is at most {longest[trigger.kind]} characters here.",
                )
                for trigger in too_long
            ]
        )


class WorkflowRevision(models.Model):
    """One saved version of a workflow document, exactly as its author wrote it. Runs pin the
    revision they started from."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="revisions")
    number = models.PositiveIntegerField(editable=False)
    source = models.TextField(editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        editable=False,
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["workflow_id", "number"]
        constraints = [
            models.UniqueConstraint(fields=["workflow", "number"], name="unique_revision_number_per_workflow")
        ]

    # The push triggers that saving this revision made (Workflow.add_revision), with their
    # tokens: on the object add_revision returns, never stored.
    new_triggers: tuple[NewTrigger, ...] = ()

    def __str__(self) -> str:
        return f"{self.workflow.name} #{self.number}"

    def parsed(self) -> ParsedWorkflow:
        """The document as the engine uses it (it was valid when saved)."""
        return validate.parse(self.source, stored=True)


# Runs -----------------------------------------------------------------------------------------
#
# A run pins the revision it started from and has one StepRun per step of it. Statuses and
# outcomes are RFC 0005's. Every change of a step's status is a compare-and-set UPDATE that
# names what it leaves (and, for a step a worker holds, the worker's lease), so a duplicated
# message, a slow worker or a sweeper can never both win. workflows.engine moves runs along.


class RunStatus(models.TextChoices):
    INITIALIZING = "initializing", "initializing"  # created; no worker has looked at it yet
    IN_PROGRESS = "in-progress", "in-progress"
    COMPLETE = "complete", "complete"


class RunOutcome(models.TextChoices):
    SUCCESS = "success", "success"
    FAILURE = "failure", "failure"
    SYSTEM_ERROR = "system-error", "system-error"
    CANCELLED = "cancelled", "cancelled"


class StepStatus(models.TextChoices):
    PENDING = "pending", "pending"  # waiting for the steps it comes after
    IN_PROGRESS = "in-progress", "in-progress"  # started: being worked, or waiting without a worker
    SUCCESS = "success", "success"
    FAILURE = "failure", "failure"
    SYSTEM_ERROR = "system-error", "system-error"
    SKIPPED = "skipped", "skipped"
    CANCELLED = "cancelled", "cancelled"


RESOLVED = frozenset(
    {
        StepStatus.SUCCESS,
        StepStatus.FAILURE,
        StepStatus.SYSTEM_ERROR,
        StepStatus.SKIPPED,
        StepStatus.CANCELLED,
    }
)


class Decision(models.TextChoices):
    NONE = "", "none"
    APPROVED = "approved"
    REJECTED = "rejected"


class Conflict(Exception):
    """The request does not fit the run's or step's current state; the message says why."""


class OverBudget(Exception):
    """More than a budget allows (docs/security.md "Budgets"); the message says which and how much.
    `size`: a budget of bytes (a 413 for the API), else of a count (a 429)."""

    def __init__(self, message: str, size: bool) -> None:
        super().__init__(message)
        self.size = size


class WorkflowRun(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="runs")
    # Revisions go only with their workflow (and its runs with it).
    revision = models.ForeignKey(WorkflowRevision, on_delete=models.RESTRICT, related_name="runs")
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.INITIALIZING)
    outcome = models.CharField(max_length=16, choices=RunOutcome.choices, blank=True)
    message = models.TextField(blank=True)
    parameters = models.JSONField(default=dict, blank=True)  # bound: given values and defaults
    # The push event that started it; a purged event leaves the run.
    event = models.ForeignKey(
        "triggers.Event", null=True, blank=True, on_delete=models.SET_NULL, related_name="workflow_runs"
    )
    # The schedule trigger that started it, and the slot it was due for (a schedule missed
    # while the service was down runs once, for the first slot it missed).
    schedule = models.ForeignKey(
        "triggers.Schedule", null=True, blank=True, on_delete=models.SET_NULL, related_name="workflow_runs"
    )
    scheduled_for = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    cancel_requested = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    # A run a step started (the step runtime's POST /workflows/{name}/run): that step, and
    # how deep the run is in such a chain (0: started by a user, a trigger or a schedule),
    # bounded by RUN_MAX_DEPTH.
    parent_step = models.ForeignKey(
        "StepRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="started_runs"
    )
    depth = models.PositiveSmallIntegerField(default=0)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["workflow", "-created_at"]),
            models.Index(fields=["status", "created_at"]),
        ]
        # An event starts one run, however many times its task is delivered.
        constraints = [
            models.UniqueConstraint(
                fields=["event"], condition=models.Q(event__isnull=False), name="one_run_per_event"
            ),
            # And a schedule one per slot: the database holds it whatever the beats do.
            models.UniqueConstraint(
                fields=["schedule", "scheduled_for"],
                condition=models.Q(schedule__isnull=False),
                name="one_run_per_schedule_slot",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.workflow.name} run {self.id}"

    def begin(self) -> bool:
        """initializing → in-progress, once."""
        now = timezone.now()
        won = WorkflowRun.objects.filter(pk=self.pk, status=RunStatus.INITIALIZING).update(
            status=RunStatus.IN_PROGRESS, started_at=now
        )
        if won:
            self.status, self.started_at = RunStatus.IN_PROGRESS, now
            notify_run_changed(self.pk)
        return bool(won)

    def finish(self, outcome: str, message: str = "") -> bool:
        """→ complete with `outcome`, once."""
        now = timezone.now()
        won = (
            WorkflowRun.objects.filter(pk=self.pk)
            .exclude(status=RunStatus.COMPLETE)
            .update(status=RunStatus.COMPLETE, outcome=outcome, message=message, ended_at=now)
        )
        if won:
            self.status, self.outcome, self.message, self.ended_at = RunStatus.COMPLETE, outcome, message, now
            notify_run_changed(self.pk)
        return bool(won)

    def request_cancel(self) -> None:
        """Mark the run cancelled; the engine then skips and cancels its steps. Raises
        Conflict when it is complete. Asking twice is no error."""
        updated = (
            WorkflowRun.objects.filter(pk=self.pk)
            .exclude(status=RunStatus.COMPLETE)
            .update(cancel_requested=True)
        )
        self.refresh_from_db(fields=["status", "outcome", "cancel_requested"])
        if not updated:
            raise Conflict(f"The run is complete ({self.outcome}); there is nothing to cancel.")


class JSONMerge(models.Func):
    """`column` with `values`' keys set (each value replaced whole), computed by the database,
    so that two writers of different keys never lose each other's (an output set through the
    step runtime API while the engine records the step's end). PostgreSQL: jsonb `||`;
    SQLite: json_set, one path per key (keys may not contain a double quote there)."""

    output_field = models.JSONField()

    def __init__(self, column: str, values: dict[str, Any]) -> None:
        super().__init__(models.F(column))
        self.values = values

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        column, params = compiler.compile(self.source_expressions[0])
        return f"(COALESCE({column}, '{{}}'::jsonb) || %s::jsonb)", [*params, json.dumps(self.values)]

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        column, params = compiler.compile(self.source_expressions[0])
        if not self.values:
            return f"COALESCE({column}, '{{}}')", list(params)
        pairs, values = [], []
        for key, value in self.values.items():
            if '"' in key:
                raise ValueError(f"a JSON key with a double quote cannot be set on SQLite: {key!r}")
            pairs.append("%s, json(%s)")
            values += [f'$."{key}"', json.dumps(value)]
        return f"json_set(COALESCE({column}, '{{}}'), {', '.join(pairs)})", [*params, *values]


class JSONDefault(JSONMerge):
    """`column` with `values`' keys set where it has none yet (kept where it has): the merge
    the other way round, in the database too."""

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        column, params = compiler.compile(self.source_expressions[0])
        return f"(%s::jsonb || COALESCE({column}, '{{}}'::jsonb))", [json.dumps(self.values), *params]

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        column, params = compiler.compile(self.source_expressions[0])
        # RFC 7396: the column's keys patched over the defaults.
        return f"json_patch(json(%s), COALESCE({column}, '{{}}'))", [json.dumps(self.values), *params]


class JSONBytes(models.Func):
    """The size in bytes of a JSON value, computed by the database, for budgets checked in
    the UPDATE that spends them. PostgreSQL: the jsonb value's own size, uncompressed (about
    its JSON text's: a string's bytes plus a 4-byte header where the text has 2 quotes), as
    rendering it as text would cost three times as much on a large value; SQLite: its text."""

    output_field = models.BigIntegerField()

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        sql, params = compiler.compile(self.source_expressions[0])
        return f"pg_column_size({sql})", list(params)

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        sql, params = compiler.compile(self.source_expressions[0])
        return f"length(CAST({sql} AS BLOB))", list(params)


def notify_run_changed(run_id: Any) -> None:
    """Wake the run's open pages (pages.live, through runs.notify's listener): what they show
    of it changed. Sent inside the changing transaction, it arrives once the change is
    visible. Nothing to do without PostgreSQL (the pages then ask each second)."""
    if db_connection.vendor == "postgresql":
        with db_connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [settings.WORKFLOW_RUNS_NOTIFY_CHANNEL, str(run_id)])


# A step's fields the run page shows live (pages.live.LIVE_FIELDS): a change of one wakes it.
SHOWN_LIVE = frozenset({"status", "decision", "decided_by", "message", "started_at", "ended_at"})
# The outputs it shows live too: a rollout's progress (batch k of n), published at each wait.
SHOWN_LIVE_OUTPUTS = frozenset({"rollout"})


class StepKind(models.TextChoices):
    CONTAINER = "container"
    APPROVAL = "approval"


class StepRun(models.Model):
    """One step of a run.

    A worker that starts or checks a step holds it by a lease (`lease_id`, until
    `lease_until`): only the holder may record what happened, and the sweeper takes the step
    back once the lease has run out (a killed worker). `state` is None until the step's start
    has been recorded; then it is what the step's last Wait kept. A waiting step holds no
    lease: it is checked again when `wake_kind`/`wake_key` is woken, or at `recheck_at`."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="steps")
    index = models.PositiveIntegerField()  # place in the document
    name = models.CharField(max_length=255)
    kind = models.CharField(max_length=16, choices=StepKind.choices, default=StepKind.CONTAINER)
    image = models.CharField(max_length=512, blank=True)
    status = models.CharField(max_length=16, choices=StepStatus.choices, default=StepStatus.PENDING)
    outputs = models.JSONField(default=dict, blank=True)
    state = models.JSONField(null=True, blank=True)
    message = models.TextField(blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)
    queued_at = models.DateTimeField(null=True, blank=True)  # when its start was sent
    recheck_at = models.DateTimeField(null=True, blank=True)
    wake_kind = models.CharField(max_length=32, blank=True)
    wake_key = models.CharField(max_length=255, blank=True)
    woken = models.BooleanField(default=False)  # woken while a worker held it: check again
    lease_id = models.UUIDField(null=True, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)  # tries since the last recorded outcome
    # Steps whose failure this step's `when` took care of (RFC 0005: a condition on the
    # failed step's status that was true): their failure does not fail the run.
    excused = models.JSONField(default=list, blank=True)
    decision = models.CharField(max_length=16, choices=Decision.choices, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    # UI decorators the step set through the step runtime API: name -> {"type": "link", …}.
    decorators = models.JSONField(default=dict, blank=True)
    # relay-core's output metadata, name -> {"sensitive": bool}: what PUT /outputs/{name}/metadata
    # said, and an entry for each output the step set itself through the step runtime API
    # (which it may still mark sensitive while it runs). On the step, not on its credential,
    # so that whatever shows outputs masks them from the same row.
    output_metadata = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["run_id", "index"]
        constraints = [models.UniqueConstraint(fields=["run", "name"], name="unique_step_name_per_run")]
        indexes = [
            models.Index(fields=["wake_kind", "wake_key"], name="steprun_wake"),
            models.Index(fields=["status", "lease_until"], name="steprun_lease"),
            models.Index(fields=["status", "recheck_at"], name="steprun_recheck"),
        ]
        permissions = [("approve_steprun", "Can approve or reject approval steps")]

    def __str__(self) -> str:
        return self.name

    @property
    def resolved(self) -> bool:
        return self.status in RESOLVED

    def _cas(self, where: models.Q, **changes: Any) -> bool:
        """UPDATE this step WHERE `where`; on a win, this object takes the changes too."""
        changes["updated_at"] = timezone.now()
        won = StepRun.objects.filter(where, pk=self.pk).update(**changes)
        if won:
            for name, value in changes.items():
                setattr(self, name, value)
            if SHOWN_LIVE.intersection(changes):
                notify_run_changed(self.run_id)
        return bool(won)

    # Before the start: decided from the graph and `when`, no worker holds the step.

    def skip(self, message: str, excused: list[str] | None = None) -> bool:
        return self._cas(
            models.Q(status=StepStatus.PENDING),
            status=StepStatus.SKIPPED,
            message=message,
            excused=excused or [],
        )

    def fail_unstarted(self, message: str, excused: list[str]) -> bool:
        """It should run but cannot (an image nothing here runs, a `when` that cannot be
        decided): failure, without a start."""
        now = timezone.now()
        return self._cas(
            models.Q(status=StepStatus.PENDING),
            status=StepStatus.FAILURE,
            message=message,
            excused=excused,
            started_at=now,
            ended_at=now,
        )

    def claim(self, lease_seconds: float, excused: list[str]) -> uuid.UUID | None:
        """pending → in-progress, held by a new lease: exactly once, whatever the number of
        messages that ask for it. Returns the lease, or None when another got there first."""
        now = timezone.now()
        lease = uuid.uuid4()
        won = self._cas(
            models.Q(status=StepStatus.PENDING),
            status=StepStatus.IN_PROGRESS,
            started_at=now,
            lease_id=lease,
            lease_until=now + timedelta(seconds=lease_seconds),
            attempts=1,
            excused=excused,
        )
        return lease if won else None

    def await_answer(self, timeout: float, excused: list[str]) -> bool:
        """An approval: pending → in-progress, waiting for a decision until `timeout` seconds."""
        now = timezone.now()
        return self._cas(
            models.Q(status=StepStatus.PENDING),
            status=StepStatus.IN_PROGRESS,
            started_at=now,
            state={"timeout": timeout},
            recheck_at=now + timedelta(seconds=timeout),
            excused=excused,
        )

    # In progress: a worker holds the step by its lease.

    def reclaim(self, lease_seconds: float, max_attempts: int) -> uuid.UUID | None:
        """Take a step in progress that no live lease holds (waiting, or its worker died).
        Returns the new lease; None when another holds it or when it has been tried
        `max_attempts` times without an outcome (the caller then gives up on it)."""
        now = timezone.now()
        lease = uuid.uuid4()
        free = models.Q(lease_id__isnull=True) | models.Q(lease_until__lt=now)
        won = self._cas(
            free & models.Q(status=StepStatus.IN_PROGRESS, attempts__lt=max_attempts),
            lease_id=lease,
            lease_until=now + timedelta(seconds=lease_seconds),
            attempts=models.F("attempts") + 1,
            woken=False,
        )
        if won:
            self.refresh_from_db(fields=["attempts"])
        return lease if won else None

    def mark_woken(self) -> bool:
        """A wake for a step a worker holds now: its holder checks again when it is done."""
        return self._cas(models.Q(status=StepStatus.IN_PROGRESS, lease_id__isnull=False), woken=True)

    def record_done(self, lease: uuid.UUID, success: bool, outputs: dict[str, Any], message: str) -> bool:
        won = self._cas(
            models.Q(status=StepStatus.IN_PROGRESS, lease_id=lease),
            status=StepStatus.SUCCESS if success else StepStatus.FAILURE,
            outputs=JSONMerge("outputs", outputs),
            message=message,
            ended_at=timezone.now(),
            lease_id=None,
            lease_until=None,
            recheck_at=None,
        )
        if won:
            del self.outputs  # merged in the database: read again if asked for (deferred)
        return won

    def record_wait(
        self,
        lease: uuid.UUID,
        state: dict[str, Any],
        outputs: dict[str, Any],
        recheck_at: datetime,
        wake_on: tuple[str, str] | None,
    ) -> bool:
        kind, key = wake_on or ("", "")
        won = self._cas(
            models.Q(status=StepStatus.IN_PROGRESS, lease_id=lease),
            state=state,
            outputs=JSONMerge("outputs", outputs),
            recheck_at=recheck_at,
            wake_kind=kind,
            wake_key=key,
            lease_id=None,
            lease_until=None,
            attempts=0,
        )
        if won:
            del self.outputs  # merged in the database: read again if asked for (deferred)
            if SHOWN_LIVE_OUTPUTS.intersection(outputs):  # progress shown while it waits
                notify_run_changed(self.run_id)
        return won

    # The step runtime API (stepruntime): the running step itself writes these, so they merge
    # in the database (JSONMerge) and only while the step is in progress.

    def put_output(self, name: str, value: Any) -> bool:
        """Set one output while the step runs; False when it has ended. Its metadata entry
        says it came from the step (not sensitive unless the step said so, before or after).
        Raises OverBudget when the step's outputs together would be larger than
        STEP_OUTPUTS_MAX_BYTES."""
        return self._merge_within(
            "outputs",
            name,
            value,
            settings.STEP_OUTPUTS_MAX_BYTES,
            output_metadata=JSONDefault("output_metadata", {name: {"sensitive": False}}),
        )

    def put_output_metadata(self, name: str, metadata: dict[str, Any]) -> bool:
        """PUT /outputs/{name}/metadata, before or after the value; False when the step has
        ended (its outputs and what they are are final then). Raises OverBudget past
        STEP_OUTPUT_METADATA_MAX_BYTES (a step may name any output, set or not)."""
        return self._merge_within("output_metadata", name, metadata, settings.STEP_OUTPUT_METADATA_MAX_BYTES)

    def output_is_sensitive(self, name: str) -> bool:
        return bool((self.output_metadata or {}).get(name, {}).get("sensitive"))

    def hidden_outputs(self) -> set[str]:
        """The outputs shown masked to people (the API, the admin, approvers): the sensitive
        ones, and while the step runs every one it set itself. relay-core's clients may mark
        an output sensitive after setting it (relay_sdk's raw PUTs); until the step has
        ended, and its metadata with it, nobody sees a value it might still hide."""
        metadata = self.output_metadata or {}
        running = self.status == StepStatus.IN_PROGRESS
        return {
            name
            for name in (self.outputs or {})
            if name in metadata and (running or self.output_is_sensitive(name))
        }

    @classmethod
    def sensitive_values(cls, run_id: Any, seen: dict[Any, Any] | None = None) -> list[Any]:
        """The values of the run's sensitive outputs as they are now: what its steps can
        read (GET /outputs/{step}/{name}, `!Output`) and their logs must mask. `seen`, kept
        between calls: each step's status and metadata when last read, so that an ended
        step's values are read once. Only those keys are read (outputs can be large)."""
        seen = {} if seen is None else seen
        values = []
        steps = cls.objects.filter(run_id=run_id).exclude(output_metadata={})
        for pk, status, metadata in steps.values_list("pk", "status", "output_metadata"):
            if seen.get(pk) == (status, metadata) and status != StepStatus.IN_PROGRESS:
                continue
            seen[pk] = (status, metadata)
            names = [
                name for name, about in metadata.items() if isinstance(about, dict) and about.get("sensitive")
            ]
            if names:
                keys = {f"v{i}": KeyTransform(name, "outputs") for i, name in enumerate(names)}
                row = cls.objects.filter(pk=pk).values(**keys).first() or {}
                values += [value for value in row.values() if value is not None]
        return values

    @property
    def shown_outputs(self) -> dict[str, Any]:
        """The outputs as people see them, hidden ones as MASK. Steps of the run read them
        whole (GET /outputs/{step}/{name}, their spec's `!Output`)."""
        hidden = self.hidden_outputs()
        return {name: MASK if name in hidden else value for name, value in (self.outputs or {}).items()}

    def put_decorator(self, name: str, value: dict[str, Any]) -> bool:
        """Set one UI decorator (`{"type": "link", …}`) while the step runs; False when it
        has ended. Raises OverBudget past STEP_DECORATORS_MAX_BYTES, as put_output."""
        return self._merge_within("decorators", name, value, settings.STEP_DECORATORS_MAX_BYTES)

    def _merge_within(self, column: str, name: str, value: Any, budget: int, **also: Any) -> bool:
        # The size is checked in the UPDATE's WHERE, on the merged value: PostgreSQL checks
        # it again on the row a concurrent writer left (READ COMMITTED re-evaluates the
        # WHERE after the row lock), so two PUTs at once can never both fit past the budget.
        merged = JSONMerge(column, {name: value})
        if StepRun.objects.filter(
            models.lookups.LessThanOrEqual(JSONBytes(merged), budget),
            pk=self.pk,
            status=StepStatus.IN_PROGRESS,
        ).update(**{column: merged}, **also):
            return True
        if not StepRun.objects.filter(pk=self.pk, status=StepStatus.IN_PROGRESS).exists():
            return False
        setting = {
            "outputs": "STEP_OUTPUTS_MAX_BYTES",
            "decorators": "STEP_DECORATORS_MAX_BYTES",
            "output_metadata": "STEP_OUTPUT_METADATA_MAX_BYTES",
        }[column]
        raise OverBudget(
            f"The step's {column} together would be larger than {budget} bytes as stored "
            f"({setting}); {name!r} was not set.",
            size=True,
        )

    def take_wake(self) -> bool:
        """After a Wait was recorded: True (once) if a wake came while the step was held."""
        return self._cas(
            models.Q(status=StepStatus.IN_PROGRESS, lease_id__isnull=True, woken=True), woken=False
        )

    def end(self, lease: uuid.UUID, status: str, message: str) -> bool:
        """The holder ends the step without a handler's outcome: failure (what it refers to is
        not there), system-error (the worker could not do its job), or cancelled."""
        return self._cas(
            models.Q(status=StepStatus.IN_PROGRESS, lease_id=lease),
            status=status,
            message=message,
            ended_at=timezone.now(),
            lease_id=None,
            lease_until=None,
            recheck_at=None,
        )

    def release(self, lease: uuid.UUID, message: str, retry_after: float) -> bool:
        """The holder could not finish (an exception): the step may be taken again after
        `retry_after` seconds (the sweeper does, or the retry the task queued)."""
        return self._cas(
            models.Q(status=StepStatus.IN_PROGRESS, lease_id=lease),
            message=message,
            lease_until=timezone.now() + timedelta(seconds=retry_after),
        )

    def give_up(self, max_attempts: int) -> bool:
        """Tried `max_attempts` times without an outcome, and no live lease: system-error."""
        now = timezone.now()
        free = models.Q(lease_id__isnull=True) | models.Q(lease_until__lt=now)
        reason = self.message or "the worker stopped before it could record an outcome"
        return self._cas(
            free & models.Q(status=StepStatus.IN_PROGRESS, attempts__gte=max_attempts),
            status=StepStatus.SYSTEM_ERROR,
            message=f"Gave up after {max_attempts} attempts: {reason}",
            ended_at=now,
            lease_id=None,
            lease_until=None,
            recheck_at=None,
        )

    # Approvals: no worker holds them; the answer ends them.

    def approve(self, user: Any) -> None:
        self._decide(user, Decision.APPROVED, StepStatus.SUCCESS, f"Approved by {user.get_username()}.")

    def reject(self, user: Any) -> None:
        self._decide(user, Decision.REJECTED, StepStatus.FAILURE, f"Rejected by {user.get_username()}.")

    def _decide(self, user: Any, decision: str, status: str, message: str) -> None:
        if self.kind != StepKind.APPROVAL:
            raise Conflict(f"Step {self.name!r} is not an approval.")
        now = timezone.now()
        waiting = models.Q(status=StepStatus.IN_PROGRESS, decision="")
        if not self._cas(
            waiting,
            status=status,
            decision=decision,
            decided_by=user,
            decided_at=now,
            message=message,
            ended_at=now,
            recheck_at=None,
        ):
            self.refresh_from_db()
            if self.status == StepStatus.PENDING:
                raise Conflict(f"Approval {self.name!r} is not waiting for an answer yet.")
            raise Conflict(f"Approval {self.name!r} is {self.status}; it can no longer be answered.")

    def time_out(self, message: str) -> bool:
        """An approval nobody answered before its `recheck_at`: failure."""
        now = timezone.now()
        return self._cas(
            models.Q(status=StepStatus.IN_PROGRESS, decision="", lease_id__isnull=True, recheck_at__lte=now),
            status=StepStatus.FAILURE,
            message=message,
            ended_at=now,
            recheck_at=None,
        )

    def cancel_waiting(self, message: str) -> bool:
        """A step in progress that no worker holds (an approval, or a step whose worker
        has gone) ends cancelled."""
        now = timezone.now()
        free = models.Q(lease_id__isnull=True) | models.Q(lease_until__lt=now)
        return self._cas(
            free & models.Q(status=StepStatus.IN_PROGRESS),
            status=StepStatus.CANCELLED,
            message=message,
            ended_at=now,
            lease_id=None,
            lease_until=None,
            recheck_at=None,
        )


class Approval(StepRun):
    """Approval steps, for their page in the admin."""

    class Meta:
        proxy = True


# Secrets --------------------------------------------------------------------------------------


class WorkflowSecret(models.Model):
    """A workflow's secret, by name. Its value lives in Vault only, at
    `<VAULT_PATH_PREFIX>/workflows/<workflow uuid>/secrets/<name>` (key `value`), tagged with
    this deployment like every other secret; it is never shown back. The engine reads the
    ones a step refers to when the step starts."""

    MAX_LENGTH = 65536

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="secrets")
    name = models.CharField(max_length=64, validators=[name_validator])
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["workflow_id", "name"]
        constraints = [
            models.UniqueConstraint(fields=["workflow", "name"], name="unique_secret_name_per_workflow")
        ]

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def path_for(workflow_id: uuid.UUID, name: str) -> str:
        return vault.path_for("workflows", f"{workflow_id}/secrets/{name}")

    @property
    def vault_path(self) -> str:
        return self.path_for(self.workflow_id, self.name)

    @classmethod
    @sensitive_variables("value")
    def put(cls, workflow: Workflow, name: str, value: str, user: Any) -> "WorkflowSecret":
        """Create or replace. The row is written first and Vault last in one transaction, so
        a Vault failure (VaultUnavailable) leaves neither; the row lock and Vault's
        check-and-set keep two writers from losing each other's versions."""
        with transaction.atomic():
            secret, _ = cls.objects.select_for_update().get_or_create(workflow=workflow, name=name)
            secret.updated_at, secret.updated_by = timezone.now(), user
            secret.save(update_fields=["updated_at", "updated_by"])
            _, version = vault.read_with_version(secret.vault_path)
            vault.write(secret.vault_path, {"value": value}, cas=version)
        return secret

    @classmethod
    def value_of(cls, workflow_id: uuid.UUID, name: str) -> str | None:
        """The value, read from Vault; None when the workflow has no such secret.

        A step's spec is evaluated again on each call of the step runtime API, and a Vault
        read is most of such a call's time: values are kept in this process for
        SECRET_CACHE_SECONDS, by the row's `updated_at`, which `put` changes in the
        transaction that writes Vault, so a replaced value is never served from here."""
        found = _secret_updated_at(workflow_id, name)
        if not found:
            return None
        updated_at = found[0][0]
        key = (str(workflow_id), name, updated_at)
        kept = _secret_values.get(key)
        if kept is not None and kept[0] > time.monotonic():
            return kept[1]
        data = vault.read(cls.path_for(workflow_id, name))
        value = None if data is None else data.get("value")
        if len(_secret_values) >= SECRET_CACHE_ENTRIES:
            _secret_values.clear()  # bounded; a refill costs one Vault read each
        _secret_values[key] = (time.monotonic() + settings.SECRET_CACHE_SECONDS, value)
        return value


# WorkflowSecret.value_of's statement (relay.rows: on every call of the step runtime API
# whose step has a secret, and Django's compiling it was most of its time).
_secret_updated_at = rows.Select(WorkflowSecret, ("updated_at",), where=("workflow", "name"))

# WorkflowSecret.value_of's values: (workflow id, name, updated_at) -> (expiry, value).
_secret_values: dict[tuple[str, str, datetime], tuple[float, str | None]] = {}
SECRET_CACHE_ENTRIES = 1024


@receiver(post_delete, sender=WorkflowSecret)
def _delete_secret_value(sender: type, instance: WorkflowSecret, **kwargs: object) -> None:
    """A deleted secret's value goes too, after the commit (with the workflow as well). If
    Vault is down then, the value stays there, and the log says where."""
    path = instance.vault_path

    def purge() -> None:
        try:
            vault.delete(path)
        except vault.VaultUnavailable as exc:
            log.warning("vault secret %s of a deleted workflow secret left behind: %s", path, exc)

    transaction.on_commit(purge)
