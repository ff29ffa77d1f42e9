"""Push triggers and the events (Puppet reports) they receive at /api/events."""

import uuid
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import models, transaction
from django.db.models import F
from django.db.models.fields.json import KeyTransform
from django.dispatch import Signal
from django.utils import timezone

from connections.models import name_validator
from relay import tokens, vault
from triggers.reports import Filters


class TriggerKind(models.TextChoices):
    PUSH = "push"  # POST /api/events: Puppet reports and Relay push bodies
    WEBHOOK = "webhook"  # POST /api/webhooks/<id>/: any JSON object is the event


def image_repository(image: str) -> str:
    """`relaysh/stdlib-trigger-json` of `docker.io/relaysh/stdlib-trigger-json:latest` (or
    of any tag or digest of it), lower case."""
    name = image.strip().lower().split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: len(name) - len(last)] + last.split(":", 1)[0]
    for registry in ("docker.io/", "index.docker.io/", "registry-1.docker.io/"):
        name = name.removeprefix(registry)
    return name


class Trigger(tokens.TokenHolder):
    """A push trigger: Puppet (or the module's report processor) posts reports with its token.

    The filters choose which reports match; an empty list means "any". The Slack incoming
    webhook URL, when there is one, lives in the trigger's Vault secret (key
    `slack_webhook_url`), never in this row.

    A trigger of a workflow is one that the workflow's document declares (`triggers:` with
    `source: {type: push}`), named as there: the workflow's revisions make and delete it
    (workflows.models.Workflow.add_revision), and each event it matches starts a run
    (workflows.services.start_run_for_event). Its filters and Slack webhook work as for any.

    A workflow's webhook trigger (`source: {type: webhook}`) is a row here too, of kind
    `webhook`: a token like a push trigger's, but its events come to its own URL
    (/api/webhooks/<id>/) as any JSON object, which is the event as it is (triggers.webhooks);
    the filters and Slack webhook, which read Puppet reports, do not apply to it."""

    TOKEN_PREFIX = "rlyt"
    VAULT_KIND = "triggers"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="push_triggers"
    )
    name = models.CharField(max_length=64, validators=[name_validator])
    kind = models.CharField(
        max_length=16, choices=TriggerKind.choices, default=TriggerKind.PUSH, editable=False
    )
    # A webhook trigger's `source.image`, as its workflow's document names it.
    image = models.CharField(max_length=512, blank=True, editable=False)
    description = models.TextField(blank=True, max_length=2000)
    created = models.DateTimeField(default=timezone.now, editable=False)
    token_regenerated_at = models.DateTimeField(null=True, blank=True, editable=False)

    statuses = models.JSONField(default=list, blank=True, help_text="Report statuses, e.g. changed, failed.")
    environments = models.JSONField(default=list, blank=True)
    host_globs = models.JSONField(default=list, blank=True, help_text="e.g. web*.example.com")
    resource_types = models.JSONField(default=list, blank=True, help_text="e.g. File, Service")
    title_globs = models.JSONField(default=list, blank=True, help_text="e.g. /etc/nginx/*")
    tags = models.JSONField(
        default=list,
        blank=True,
        help_text="Tags or classes, e.g. profile::web; a changed resource must carry one.",
    )
    has_slack_webhook = models.BooleanField(default=False, editable=False)
    workflow = models.ForeignKey(
        "workflows.Workflow",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="push_triggers",
        editable=False,
    )

    class Meta:
        ordering = ["owner_id", "name"]
        constraints = [
            # A trigger of its own is named uniquely among its owner's; a workflow's, among
            # that workflow's (as the document names it).
            models.UniqueConstraint(
                fields=["owner", "name"],
                condition=models.Q(workflow__isnull=True),
                name="unique_trigger_name_per_owner",
            ),
            models.UniqueConstraint(
                fields=["workflow", "name"],
                condition=models.Q(workflow__isnull=False),
                name="unique_trigger_name_per_workflow",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def webhook_url(self) -> str:
        """Where a webhook trigger's events go; "" for a push trigger."""
        if self.kind != TriggerKind.WEBHOOK:
            return ""
        return f"{settings.RELAY_PUBLIC_URL}/api/webhooks/{self.pk}/"

    @property
    def passes_through(self) -> bool:
        """Whether a webhook trigger's image is one that passes the JSON body through as the
        event (WEBHOOK_PASS_THROUGH_IMAGES): the only kind this service can stand in for, as
        it runs no containers. Any tag or digest of a listed repository counts."""
        return image_repository(self.image) in {
            image_repository(image) for image in settings.WEBHOOK_PASS_THROUGH_IMAGES
        }

    def filters(self) -> Filters:
        return Filters(
            self.statuses,
            self.environments,
            self.host_globs,
            self.resource_types,
            self.title_globs,
            self.tags,
        )

    def set_slack_webhook(self, url: str) -> None:
        """Store (or with "" remove) the webhook URL in the trigger's Vault secret, keeping its
        token: a read-modify-write under the row lock and Vault's check-and-set."""
        with transaction.atomic():
            type(self).objects.select_for_update().filter(pk=self.pk).first()
            current, version = vault.read_with_version(self.vault_path)
            secret = {key: value for key, value in current.items() if key != "slack_webhook_url"}
            if url:
                secret["slack_webhook_url"] = url
            vault.write(self.vault_path, secret, cas=version)
            self.has_slack_webhook = bool(url)
            type(self).objects.filter(pk=self.pk).update(has_slack_webhook=self.has_slack_webhook)

    def slack_webhook_url(self) -> str:
        """Read from Vault when a notification is sent; '' when there is none."""
        if not self.has_slack_webhook:
            return ""
        return (vault.read(self.vault_path) or {}).get("slack_webhook_url", "")


class EventState(models.TextChoices):
    RECEIVED = "received"  # stored; waiting for a worker
    MATCHED = "matched"
    FILTERED = "filtered"
    DUPLICATE = "duplicate"  # same transaction_uuid or key as an earlier event
    FAILED = "failed"  # could not be read, or given up on: see failure_reason


DONE_STATES = (EventState.MATCHED, EventState.FILTERED, EventState.DUPLICATE, EventState.FAILED)


class WorkflowStart(models.TextChoices):
    """What became of a workflow trigger's matched event (workflows.services)."""

    NONE = "", "none"  # not an event a workflow's trigger matched
    PENDING = "pending"  # matched; the run is not decided yet
    STARTED = "started"  # a run was made (its `event` is this one)
    SKIPPED = "skipped"  # no run: the trigger's `when` was false or could not be decided (see filter_note)


class BodyFormat(models.TextChoices):
    JSON = "json"  # a Relay push body or a Puppet JSON report; the worker tells which
    YAML = "yaml"  # a Puppet YAML report, as Puppet's http processor sends it


# Sent in the deleting transaction, before events are deleted (`events`: a queryset of them),
# so that their stored objects are released with them: triggers.objects receives it. A signal
# of its own rather than pre_delete: a bulk delete sends it once, not once per row.
events_deleting = Signal()


class EventQuerySet(models.QuerySet):
    def delete(self) -> tuple[int, dict[str, int]]:
        """Delete the events and release their stored objects, in one transaction: the admin's
        bulk delete, the retention purge and any other come here."""
        with transaction.atomic(using=self.db):
            events_deleting.send(sender=Event, events=self)
            return super().delete()


# The keys of Event.parts, as triggers.services.process writes them.
PART_KINDS = ("report", "logs", "events")


class Event(models.Model):
    """A report as received. Its body is in storage under its SHA-256 (`body_sha256`); the
    worker fills `summary` and `parts` (offloaded logs, resource events and the normalised
    report, each {"name", "size", "sha256"}). Deleting events deletes those objects once no
    other event refers to them (triggers.objects)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    trigger = models.ForeignKey(Trigger, on_delete=models.CASCADE, related_name="events")
    state = models.CharField(max_length=16, choices=EventState.choices, default=EventState.RECEIVED)
    received_at = models.DateTimeField(default=timezone.now)
    processed_at = models.DateTimeField(null=True, blank=True)
    body_format = models.CharField(max_length=8, choices=BodyFormat.choices)
    body_sha256 = models.CharField(max_length=64)
    body_size = models.BigIntegerField()
    # Attempts at reading it, counted as each begins (so a worker lost mid-read counts), and
    # when the last began: the sweeper leaves an event alone while it is being read.
    attempts = models.PositiveIntegerField(default=0)
    attempted_at = models.DateTimeField(null=True, blank=True)

    key = models.CharField(max_length=255, blank=True)
    transaction_uuid = models.CharField(max_length=64, blank=True)
    host = models.CharField(max_length=255, blank=True)
    status = models.CharField(max_length=32, blank=True)
    summary = models.JSONField(null=True, blank=True)
    parts = models.JSONField(default=dict, blank=True)
    # Why it failed; while `received`, why the last attempt did not finish (storage or
    # database unavailable), "" when it was lost with its worker.
    failure_reason = models.TextField(blank=True)
    # Why the trigger's filters dropped the report, or which filter could not judge it.
    filter_note = models.TextField(blank=True)
    duplicate_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL)
    # The Slack message for a match: "" (none to send), pending, sent or failed (see detail).
    notification = models.CharField(max_length=16, blank=True)
    notification_detail = models.TextField(blank=True)
    notified_at = models.DateTimeField(null=True, blank=True)
    # What a workflow trigger's `when` and bindings read as `event` (`!Data host`,
    # `${event.noop}`): the Puppet module's push body's shape, whichever way the report came
    # (triggers.reports.event_data); null when it was too large to keep.
    data = models.JSONField(null=True, blank=True)
    workflow_start = models.CharField(max_length=16, choices=WorkflowStart.choices, blank=True)

    objects = EventQuerySet.as_manager()

    class Meta:
        ordering = ["-received_at"]
        indexes = [
            models.Index(fields=["trigger", "-received_at"]),
            models.Index(fields=["state", "received_at"]),
            models.Index(fields=["trigger", "transaction_uuid"]),
            models.Index(fields=["trigger", "key"]),
            models.Index(fields=["trigger", "body_sha256"]),
            # Who else refers to a stored object (triggers.objects.is_referenced), and what
            # the retention purge deletes.
            models.Index(fields=["body_sha256"], name="event_body_sha256"),
            *(
                models.Index(KeyTransform("name", KeyTransform(kind, "parts")), name=f"event_{kind}_part")
                for kind in PART_KINDS
            ),
            models.Index(fields=["received_at"], name="event_received_at"),
            # What the sweeper sends again (triggers.tasks.requeue_received_before).
            models.Index(
                fields=["processed_at"],
                condition=models.Q(workflow_start="pending"),
                name="event_workflow_start_pending",
            ),
        ]
        # One read report per (trigger, transaction_uuid) and per (trigger, key): a second is a
        # resend and ends `duplicate`. Enforced here so that two workers cannot both win.
        constraints = [
            models.UniqueConstraint(
                fields=["trigger", "transaction_uuid"],
                condition=models.Q(state__in=["matched", "filtered"]) & ~models.Q(transaction_uuid=""),
                name="one_report_per_transaction",
            ),
            models.UniqueConstraint(
                fields=["trigger", "key"],
                condition=models.Q(state__in=["matched", "filtered"]) & ~models.Q(key=""),
                name="one_report_per_key",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.host or 'event'} {self.id}"

    # Each transition below is from `received` only, with a compare-and-set: when nothing
    # was updated, another delivery of the same task got there first, and this one stops.

    def start_attempt(self) -> bool:
        """Count an attempt before reading begins, in its own commit: a read that takes the
        worker down still counts."""
        now = timezone.now()
        started = (
            type(self)
            .objects.filter(pk=self.pk, state=EventState.RECEIVED)
            .update(attempts=F("attempts") + 1, attempted_at=now, failure_reason="")
        )
        if started:
            self.attempts, self.attempted_at, self.failure_reason = self.attempts + 1, now, ""
        return bool(started)

    def note_error(self, error: str) -> None:
        """Why this attempt did not finish (it will be retried)."""
        type(self).objects.filter(pk=self.pk, state=EventState.RECEIVED).update(failure_reason=error[:2000])

    def finish(self, state: str, **fields: Any) -> bool:
        """Read: matched, filtered, duplicate, or failed (with `failure_reason`)."""
        return bool(
            type(self)
            .objects.filter(pk=self.pk, state=EventState.RECEIVED)
            .update(state=state, processed_at=timezone.now(), **fields)
        )

    def fail(self, reason: str) -> bool:
        return self.finish(EventState.FAILED, failure_reason=reason[:2000])

    def give_up(self) -> bool:
        """Failed for good after EVENTS_MAX_ATTEMPTS attempts, with the last one's error."""
        return self.fail(f"gave up after {self.attempts} attempts: {self.failure_reason or 'worker lost'}")

    @property
    def out_of_attempts(self) -> bool:
        return self.attempts >= settings.EVENTS_MAX_ATTEMPTS

    # After `matched`, for a workflow's trigger: a compare-and-set from `pending` as well.

    def end_workflow_start(self, outcome: str, note: str = "") -> bool:
        """pending → started or skipped (with why in filter_note), once. Call in the
        transaction that makes the run."""
        fields: dict[str, Any] = {"workflow_start": outcome}
        if note:
            fields["filter_note"] = note[:2000]
        return bool(
            type(self).objects.filter(pk=self.pk, workflow_start=WorkflowStart.PENDING).update(**fields)
        )

    def delete(self, using: str | None = None, keep_parents: bool = False) -> tuple[int, dict[str, int]]:
        with transaction.atomic(using=using):
            events_deleting.send(sender=Event, events=Event.objects.filter(pk=self.pk))
            return super().delete(using, keep_parents)


class ReleasedObject(models.Model):
    """An object in the events storage that a deleted event referred to: deleted from storage
    once no event refers to it, then this row goes (triggers.objects). A row is also the lock
    that a new reference to the same name takes (triggers.objects.claim)."""

    name = models.CharField(primary_key=True, max_length=255)
    # When it was released, or when its last deletion failed: the sweep takes the oldest first.
    queued_at = models.DateTimeField(default=timezone.now, db_index=True)

    def __str__(self) -> str:
        return self.name


class Schedule(models.Model):
    """A workflow's schedule trigger (`source: {type: schedule, schedule: '<cron>'}`), made,
    changed and deleted with the workflow's revisions (Workflow.sync_schedules).

    `next_due` is when it is next due, in UTC: beat's workflows.tasks.start_due_schedules
    takes only the rows whose time has come (an index on it), so nothing scans every
    workflow. Taking a slot moves `next_due` past now with a compare-and-set, in the
    transaction that makes the run: one run per slot however many beats and workers look
    at once, and a schedule missed while the service was down runs once, not once per slot."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workflow = models.ForeignKey("workflows.Workflow", on_delete=models.CASCADE, related_name="schedules")
    name = models.CharField(max_length=255)
    schedule = models.CharField(max_length=255)  # as the document writes it
    next_due = models.DateTimeField()
    created = models.DateTimeField(default=timezone.now, editable=False)
    # The slot it last took, when, and what became of it (a run, or why none).
    last_due = models.DateTimeField(null=True, blank=True)
    last_taken_at = models.DateTimeField(null=True, blank=True)
    last_note = models.TextField(blank=True)

    class Meta:
        ordering = ["workflow_id", "name"]
        constraints = [
            models.UniqueConstraint(fields=["workflow", "name"], name="unique_schedule_name_per_workflow")
        ]
        indexes = [models.Index(fields=["next_due"], name="schedule_next_due")]

    def __str__(self) -> str:
        return f"{self.name} ({self.schedule})"

    def take(self, now: datetime, next_due: datetime) -> bool:
        """Take the slot this object read (`next_due` as loaded) and move on to `next_due`:
        True once per slot. When nothing was updated, another worker took it first (or a
        revision changed the schedule meanwhile)."""
        slot = self.next_due
        won = (
            type(self)
            .objects.filter(pk=self.pk, next_due=slot)
            .update(next_due=next_due, last_due=slot, last_taken_at=now, last_note="")
        )
        if won:
            self.next_due, self.last_due, self.last_taken_at, self.last_note = next_due, slot, now, ""
        return bool(won)

    def note(self, text: str) -> None:
        """What became of the slot last taken (no run: `when` false; or the run's id)."""
        type(self).objects.filter(pk=self.pk).update(last_note=text[:2000])
        self.last_note = text[:2000]
