"""What the step runtime API keeps: each running step's credential, and what a step sent
that has no place on workflows.StepRun (logs, events, its reported status).

A credential is a token of kind `rlys` (relay.tokens: lookup part and peppered digest only),
one per step run. It opens the API only while its step run is `in-progress`, checked on
every request, so it expires when the step ends without any revoke.
"""

import hmac
import uuid
from typing import Any, Self

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables

from relay import rows, tokens
from workflows.models import OverBudget, StepRun, StepStatus


class StepCredential(models.Model):
    """The credential of one step run (its METADATA_API_URL's user part)."""

    TOKEN_PREFIX = "rlys"

    step_run = models.OneToOneField(StepRun, on_delete=models.CASCADE, related_name="credential")
    token_lookup = models.CharField(max_length=tokens.LOOKUP_LENGTH, unique=True, editable=False)
    token_digest = models.CharField(max_length=64, editable=False)
    token_pepper_id = models.PositiveSmallIntegerField(editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    # What the step last said with PUT /status (relay-core's process state and when
    # condition), kept for people: the engine decides the step's status itself.
    reported_status = models.JSONField(null=True, blank=True)
    # What the step has spent of its budgets (settings STEP_LOG_*, STEP_EVENTS_*): runtime
    # log records (a log opened, a message) and their bytes; emitted events and theirs.
    log_records = models.PositiveIntegerField(default=0, editable=False)
    log_bytes = models.PositiveBigIntegerField(default=0, editable=False)
    events = models.PositiveIntegerField(default=0, editable=False)
    event_bytes = models.PositiveBigIntegerField(default=0, editable=False)

    def __str__(self) -> str:
        return f"{self.TOKEN_PREFIX}_{self.token_lookup}…"

    @classmethod
    @sensitive_variables("token")
    def issue(cls, step_run_id: Any) -> tokens.PlainToken:
        """A new token for the step run, replacing any earlier one (which stops working when
        this commits)."""
        token = tokens.generate(cls.TOKEN_PREFIX)
        lookup = tokens.parse(token, cls.TOKEN_PREFIX)
        assert lookup is not None
        pepper_id = tokens.current_pepper_id()
        cls.objects.update_or_create(
            step_run_id=step_run_id,
            defaults={
                "token_lookup": lookup.lookup,
                "token_digest": tokens.digest(token, pepper_id),
                "token_pepper_id": pepper_id,
                "created_at": timezone.now(),
            },
        )
        return token

    @classmethod
    @sensitive_variables("raw")
    def for_token(cls, raw: str) -> "Self | None":
        """The credential this token belongs to, with its step run, run and workflow loaded
        (one query), or None. Unknown, malformed and wrong tokens are indistinguishable."""
        parsed = tokens.parse(raw, cls.TOKEN_PREFIX)
        if parsed is None:
            return None
        found = _with_step(parsed.lookup)
        if found is None or found.token_pepper_id not in settings.TOKEN_PEPPERS:
            hmac.compare_digest(tokens.digest(raw, tokens.current_pepper_id()), "0" * 64)
            return None
        if not hmac.compare_digest(tokens.digest(raw, found.token_pepper_id), found.token_digest):
            return None
        return found

    @property
    def live(self) -> bool:
        """Whether its step is running (the only time the credential opens anything)."""
        return self.step_run.status == StepStatus.IN_PROGRESS

    def spend_log(self, size: int) -> None:
        """One more runtime log record of `size` bytes. Raises OverBudget past
        STEP_LOG_MAX_RECORDS or STEP_LOG_MAX_BYTES (nothing is spent then). Call in the
        transaction that stores the record, so a record not stored is not counted."""
        self._spend(
            "log_records",
            "log_bytes",
            size,
            settings.STEP_LOG_MAX_RECORDS,
            settings.STEP_LOG_MAX_BYTES,
            "runtime log records (STEP_LOG_MAX_RECORDS)",
            "bytes of runtime log (STEP_LOG_MAX_BYTES)",
        )

    def spend_event(self, size: int) -> None:
        """One more emitted event of `size` bytes; as spend_log, with STEP_EVENTS_MAX and
        STEP_EVENTS_MAX_BYTES."""
        self._spend(
            "events",
            "event_bytes",
            size,
            settings.STEP_EVENTS_MAX,
            settings.STEP_EVENTS_MAX_BYTES,
            "events (STEP_EVENTS_MAX)",
            "bytes of events (STEP_EVENTS_MAX_BYTES)",
        )

    def _spend(
        self, count: str, total: str, size: int, max_count: int, max_bytes: int, counted: str, sized: str
    ) -> None:
        # A compare-and-set: the budget is checked by the UPDATE that spends it, so requests
        # at once can never spend past it together.
        if StepCredential.objects.filter(
            pk=self.pk, **{f"{count}__lt": max_count, f"{total}__lte": max_bytes - size}
        ).update(**{count: models.F(count) + 1, total: models.F(total) + size}):
            return
        spent = StepCredential.objects.values_list(count, flat=True).get(pk=self.pk)
        if spent >= max_count:
            raise OverBudget(f"A step may send at most {max_count} {counted}.", size=False)
        raise OverBudget(f"A step may send at most {max_bytes} {sized}.", size=True)

    def report_status(self, status: dict[str, Any]) -> None:
        StepCredential.objects.filter(pk=self.pk).update(reported_status=status)
        self.reported_status = status


# What StepCredential.for_token reads on every request of the step runtime API: the credential
# by its lookup part with its step run, run, workflow and owner, in one statement written once
# per database (relay.rows: Django took three times as long to compile that five-table query
# as PostgreSQL took to answer it). Left deferred (read when asked for, as .defer() leaves
# them): what no route of the API reads from the step's own row, and what may be large
# (outputs up to STEP_OUTPUTS_MAX_BYTES, decoded again on every call a step makes).
_with_step = rows.Chain(
    StepCredential,
    ("step_run", "run", "workflow", "owner"),
    "token_lookup",
    exclude={StepRun: ("outputs", "state", "decorators")},
)


class StepLog(models.Model):
    """A log a step opened with POST /logs; its messages follow (POST /logs/{id}/messages).
    relay-core's bodies are protobuf messages of its log service: kept here as sent. A
    step's logs and messages together are bounded (StepCredential.spend_log)."""

    MAX_RECORD_BYTES = 65_536

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    step_run = models.ForeignKey(StepRun, on_delete=models.CASCADE, related_name="runtime_logs")
    header = models.BinaryField(max_length=65_536)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["step_run_id", "created_at"]

    def __str__(self) -> str:
        return f"log {self.id}"


class StepLogMessage(models.Model):
    log = models.ForeignKey(StepLog, on_delete=models.CASCADE, related_name="messages")
    body = models.BinaryField(max_length=65_536)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["log_id", "id"]

    def __str__(self) -> str:
        return f"message {self.pk} of log {self.log_id}"


class EmittedEvent(models.Model):
    """An event a step emitted with POST /events (the SDK's `events.emit`). relay-core takes
    these from webhook triggers' containers to start their workflow; a step's events are
    kept, and start nothing."""

    step_run = models.ForeignKey(StepRun, on_delete=models.CASCADE, related_name="emitted_events")
    key = models.CharField(max_length=255, blank=True)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["step_run_id", "id"]

    def __str__(self) -> str:
        return f"event {self.pk} of step run {self.step_run_id}"
