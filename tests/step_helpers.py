"""Plays the workflow engine for one step handler, as workflows/steps/base.py says the engine
does: `!Connection` resolved with connections.services.resolve_connection (its token read
from Vault) each time the handler is called, `start` once, then `check` whenever what the
step waits for changes (Wait.wake_on: here, the Puppet run's row) or at Wait.recheck_at,
until Done. Outputs a Wait publishes are kept, as the engine keeps them."""

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils import timezone

from connections.services import resolve_connection
from runs.models import Run
from workflows.steps import registry
from workflows.steps.base import Done, StepContext, StepHandler, Wait


@dataclass(frozen=True)
class Connection:
    """Stands for `!Connection {type, name}` in a spec."""

    type: str
    name: str


@dataclass
class Step:
    image: str
    spec: Mapping[str, Any]
    owner_id: int
    handler: StepHandler = field(init=False)
    state: Mapping[str, Any] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)
    outcomes: list[Done | Wait] = field(default_factory=list)
    run_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    started_at: datetime = field(default_factory=timezone.now)
    seen: tuple | None = None

    def __post_init__(self) -> None:
        self.handler = registry.HANDLERS[self.image]()

    def context(self) -> StepContext:
        spec = {}
        for key, value in self.spec.items():
            if isinstance(value, Connection):
                value = resolve_connection(self.owner_id, value.type, value.name)
                assert value is not None, "the engine fails a step whose connection does not exist"
            spec[key] = value
        return StepContext(
            step_run_id=f"{self.run_id}/step",
            run_id=self.run_id,
            owner_id=self.owner_id,
            step_name="step",
            image=self.image,
            spec=spec,
            env={},
            state=self.state,
            started_at=self.started_at,
        )

    def _note(self, outcome: Done | Wait) -> Done | Wait:
        self.outcomes.append(outcome)
        self.outputs.update(outcome.outputs)
        if isinstance(outcome, Wait):
            self.state = dict(outcome.state)
            self.seen = _watched(outcome)  # any change from here on wakes the step
        return outcome

    def start(self) -> Done | Wait:
        assert not self.outcomes, "start is called once"
        return self._note(self.handler.start(self.context()))

    def check(self) -> Done | Wait:
        return self._note(self.handler.check(self.context()))

    def cancel(self) -> None:
        self.handler.cancel(self.context())

    @property
    def last(self) -> Done | Wait:
        return self.outcomes[-1]

    def until_done(self, timeout: float = 30, between: Callable[[], None] | None = None) -> Done:
        """start (unless started), then check each time the step is woken, until Done.
        `between` is what the world does while the step waits (a bridge's move)."""
        outcome = self.last if self.outcomes else self.start()
        deadline = time.monotonic() + timeout
        while isinstance(outcome, Wait):
            if between is not None:
                between()
            self.wait_for_wake(outcome, deadline)
            outcome = self.check()
        return outcome

    def wait_for_wake(self, wait: Wait, deadline: float) -> None:
        """Until what the step waits for has changed since it said Wait, or its recheck_at."""
        while timezone.now() < wait.recheck_at:
            assert time.monotonic() < deadline, f"the step is still waiting: {self.outcomes[-1]}"
            if self.seen is not None and _watched(wait) != self.seen:
                return
            time.sleep(0.05)


def _watched(wait: Wait) -> tuple | None:
    if wait.wake_on is None:
        return None
    kind, key = wait.wake_on
    assert kind == "puppet-run"
    return tuple(Run.objects.filter(pk=key).values_list("status", "updated_at", "job_id", "cancel_requested"))
