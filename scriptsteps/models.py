"""A script step's run in its sandbox, and its log.

A ScriptRun belongs to one workflows.StepRun (a `relaysh/core` step, or another image in a
container runtime). Its life: `queued` (the handler queued it on the `steps` queue) →
`running` (a worker took it: exactly one, by compare-and-set) → `exited` (the program ended,
or a limit or a cancel stopped it; `reason` says which) or `lost` (its worker stopped being
heard of: it died, and the sandbox with it). The step's handler reads it to end the step.

The log is stored as it comes, in chunks (LogChunk) of masked text, each at its offset in
characters, so a reader tails it with `?offset=`; at most STEP_OUTPUT_BYTES of it."""

import uuid
from datetime import timedelta
from typing import Any

from django.db import models, transaction
from django.db.models import F, Q
from django.utils import timezone

from workflows.models import StepRun


class ScriptStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    EXITED = "exited"
    LOST = "lost"


class ScriptRun(models.Model):
    step_run = models.OneToOneField(
        StepRun, primary_key=True, on_delete=models.CASCADE, related_name="script"
    )
    status = models.CharField(max_length=16, choices=ScriptStatus.choices, default=ScriptStatus.QUEUED)
    queued_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    worker = models.UUIDField(null=True, blank=True)  # the run_script call that holds it
    exit_code = models.IntegerField(null=True, blank=True)
    # It never ran for want of the machine (its sandbox could not start): its step ends
    # `system-error` with `reason`.
    system_error = models.BooleanField(default=False)
    reason = models.TextField(blank=True)  # why it was stopped, or could not run
    # Milliseconds from the sandbox's start to its first output (bench/steps.py).
    first_output_ms = models.FloatField(null=True, blank=True)
    log_length = models.PositiveIntegerField(default=0)  # characters stored so far
    cancel_requested = models.BooleanField(default=False)
    requeues = models.PositiveSmallIntegerField(default=0)

    class Meta:
        indexes = [models.Index(fields=["status", "heartbeat_at"], name="scriptrun_status")]

    def __str__(self) -> str:
        return f"script of {self.step_run_id}"

    def _cas(self, where: Q, **changes: Any) -> bool:
        won = ScriptRun.objects.filter(where, pk=self.pk).update(**changes)
        if won:
            for name, value in changes.items():
                if not hasattr(value, "resolve_expression"):
                    setattr(self, name, value)
        return bool(won)

    @property
    def ended(self) -> bool:
        return self.status in (ScriptStatus.EXITED, ScriptStatus.LOST)

    @property
    def success(self) -> bool:
        return self.status == ScriptStatus.EXITED and self.exit_code == 0 and not self.reason

    def claim(self) -> uuid.UUID | None:
        """queued → running, once, whatever the number of messages: the caller holds it."""
        now = timezone.now()
        worker = uuid.uuid4()
        won = self._cas(
            Q(status=ScriptStatus.QUEUED, cancel_requested=False),
            status=ScriptStatus.RUNNING,
            worker=worker,
            started_at=now,
            heartbeat_at=now,
        )
        return worker if won else None

    def heartbeat(self, worker: uuid.UUID) -> bool:
        """Still running (called every STEP_HEARTBEAT seconds). False when it is not ours any
        more (declared lost) or its run was cancelled: the caller stops it."""
        return self._cas(
            Q(status=ScriptStatus.RUNNING, worker=worker, cancel_requested=False), heartbeat_at=timezone.now()
        )

    def append_log(self, text: str) -> None:
        """Store the next piece of the log at its offset (only its holder writes)."""
        if not text:
            return
        with transaction.atomic():
            start = ScriptRun.objects.select_for_update().values_list("log_length", flat=True).get(pk=self.pk)
            LogChunk.objects.create(script=self, start=start, text=text)
            ScriptRun.objects.filter(pk=self.pk).update(log_length=F("log_length") + len(text))
        self.log_length = start + len(text)

    def finish(
        self,
        worker: uuid.UUID,
        exit_code: int | None,
        reason: str,
        first_output_ms: float | None,
        system_error: bool = False,
    ) -> bool:
        """running → exited, by its holder."""
        return self._cas(
            Q(status=ScriptStatus.RUNNING, worker=worker),
            status=ScriptStatus.EXITED,
            exit_code=exit_code,
            reason=reason,
            first_output_ms=first_output_ms,
            ended_at=timezone.now(),
            system_error=system_error,
        )

    def fail_to_start(self, reason: str, system_error: bool = False) -> bool:
        """queued or running (by its holder, before its program started) → exited, with why."""
        return self._cas(
            Q(status__in=[ScriptStatus.QUEUED, ScriptStatus.RUNNING]),
            status=ScriptStatus.EXITED,
            reason=reason,
            ended_at=timezone.now(),
            system_error=system_error,
        )

    def lose(self, lost_after: float) -> bool:
        """running, its worker not heard of for `lost_after` seconds → lost (it died)."""
        now = timezone.now()
        return self._cas(
            Q(status=ScriptStatus.RUNNING, heartbeat_at__lt=now - timedelta(seconds=lost_after)),
            status=ScriptStatus.LOST,
            reason=(
                f"The worker running the script stopped (not heard of for {lost_after:g} seconds); "
                "the script was stopped with it and may not have finished."
            ),
            ended_at=now,
        )

    def requeue(self, max_requeues: int) -> bool:
        """Still queued (its message was lost): count one more send; False past the bound."""
        return self._cas(
            Q(status=ScriptStatus.QUEUED, requeues__lt=max_requeues),
            requeues=F("requeues") + 1,
            queued_at=timezone.now(),
        )

    def request_cancel(self) -> None:
        """Its holder stops it at its next heartbeat; a queued one never starts."""
        ScriptRun.objects.filter(pk=self.pk).update(cancel_requested=True)
        self._cas(
            Q(status=ScriptStatus.QUEUED),
            status=ScriptStatus.EXITED,
            reason="Cancelled before it started.",
            ended_at=timezone.now(),
        )

    def read_log(self, offset: int, limit: int) -> str:
        """The log from character `offset`, at most about `limit` characters (whole chunks
        after the first)."""
        chunks = LogChunk.objects.filter(script=self).order_by("start")
        first = chunks.filter(start__lte=offset).order_by("-start").values_list("start", flat=True).first()
        if first is not None:
            chunks = chunks.filter(start__gte=first)
        parts: list[str] = []
        size = 0
        for start, text in chunks.values_list("start", "text").iterator():
            if start + len(text) <= offset:
                continue
            piece = text[max(offset - start, 0) :]
            parts.append(piece)
            size += len(piece)
            if size >= limit:
                break
        return "".join(parts)[:limit]


class LogChunk(models.Model):
    script = models.ForeignKey(ScriptRun, on_delete=models.CASCADE, related_name="chunks")
    start = models.PositiveIntegerField()  # offset of its first character in the log
    text = models.TextField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["script", "start"], name="unique_log_chunk_start")]

    def __str__(self) -> str:
        return f"{self.script_id}@{self.start}"
