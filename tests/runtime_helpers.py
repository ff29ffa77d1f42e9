"""Steps in progress with a step runtime credential, for the step runtime API's tests.

No script step runs here: the tests hold a step the way the engine's worker does (claim,
then record_done), and play the step's process themselves (relay_sdk, `ni`, HTTP)."""

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.contrib.auth.models import User

from stepruntime.credentials import grant, with_user
from tests.workflow_helpers import run_of
from workflows import engine
from workflows.models import StepRun, StepStatus, WorkflowRun


@dataclass
class Running:
    run: WorkflowRun
    step: StepRun
    lease: Any
    url: str  # METADATA_API_URL, with the credential as its user part

    @property
    def token(self) -> str:
        return urlsplit(self.url).username or ""

    def end(self, success: bool = True) -> None:
        assert self.step.record_done(self.lease, success, {}, "")


def start_step(run: WorkflowRun, name: str, base: str | None = None) -> Running:
    """Hold step `name` of `run` in progress, as a worker that started it does, and grant
    it a credential (on `base`, the live server's URL, when given)."""
    if run.status == "initializing":
        run.begin()
    step = run.steps.get(name=name)
    lease = step.claim(300, [])
    assert lease is not None, f"step {name} is {step.status}"
    url = grant(step.pk)
    if base:
        url = with_user(base, urlsplit(url).username or "")
    return Running(run, step, lease, url)


def running(owner: User, source: str, step: str, base: str | None = None, **kwargs: Any) -> Running:
    return start_step(run_of(owner, source, **kwargs), step, base)


def later_step_outputs(run: WorkflowRun, name: str) -> dict[str, Any]:
    """Start step `name` (the engine's start_step, in this process) and return its outputs."""
    step = run.steps.get(name=name)
    engine.start_step(str(step.pk))
    step.refresh_from_db()
    assert step.status == StepStatus.SUCCESS, (step.status, step.message)
    return step.outputs
