"""Real Celery workers for the workflow engine's tests, on the tests' Redis db and database."""

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection

from tests.events_helpers import ChildProcess, clear_queues, wait_until
from triggers.models import Event
from workflows import engine
from workflows.models import StepRun, Workflow, WorkflowRun

ROOT = Path(__file__).resolve().parent.parent


class EngineWorker(ChildProcess):
    """`celery worker` in its own process (prefork with `concurrency` children, or solo),
    with the internal do-nothing step image turned on; its log goes to `log_path`."""

    def __init__(
        self,
        log_path: Path,
        concurrency: int = 4,
        pool: str = "prefork",
        queues: str = "celery",
        **env: str,
    ) -> None:
        db = connection.settings_dict
        self.log_path = log_path
        self.process = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "celery"),
                "-A",
                "relay",
                "worker",
                "--pool",
                pool,
                "--concurrency",
                str(concurrency),
                "--queues",
                queues,
                "--hostname",
                f"{queues.replace(',', '-')}-{uuid.uuid4().hex[:8]}@%h",
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
                "--loglevel",
                "INFO",
            ],
            cwd=ROOT,
            env={
                **os.environ,
                "DJANGO_SETTINGS_MODULE": "tests.settings",
                "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
                "WORKFLOW_NOOP_STEPS": "true",
                **env,
            },
            stdout=log_path.open("ab"),
            stderr=subprocess.STDOUT,
        )
        wait_until(lambda: b"ready." in log_path.read_bytes() or self.process.poll() is not None, 60)
        assert self.process.poll() is None, log_path.read_text()[-3000:]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def vault_worker(
    django_db_blocker, bao, log_path: Path, concurrency: int = 2, **env: str
) -> Iterator[EngineWorker]:
    """A module's engine worker, with OpenBao, on a broker emptied of earlier modules' messages;
    stopped when the module is done."""
    clear_queues(redis.Redis.from_url(settings.CELERY_BROKER_URL))
    with django_db_blocker.unblock():
        process = EngineWorker(
            log_path, concurrency=concurrency, VAULT_ADDR=bao.addr, VAULT_TOKEN=bao.root().token, **env
        )
    yield process
    process.stop()


def waiting_at_gate(run: WorkflowRun) -> StepRun:
    """The run started, its step `a` done and its approval `gate` waiting: in process, no worker."""
    engine.start_run(run.pk)
    engine.start_step(str(steps_of(run)["a"].pk))
    gate = steps_of(run)["gate"]
    engine.start_step(str(gate.pk))
    gate.refresh_from_db()
    assert gate.status == "in-progress"
    return gate


def make_workflow(owner: User, source: str, name: str = "wf") -> Workflow:
    workflow = Workflow.objects.create(owner=owner, name=name)
    workflow.add_revision(source, owner)
    return workflow


def run_of(owner: User, source: str, parameters: dict | None = None, name: str = "wf") -> WorkflowRun:
    return engine.create_run(make_workflow(owner, source, name), parameters or {}, created_by=owner)


def finished(run: WorkflowRun, timeout: float = 30) -> WorkflowRun:
    """The run once complete."""
    wait_until(lambda: WorkflowRun.objects.get(pk=run.pk).status == "complete", timeout)
    return WorkflowRun.objects.get(pk=run.pk)


def steps_of(run: WorkflowRun) -> dict[str, StepRun]:
    return {step.name: step for step in StepRun.objects.filter(run=run)}


def statuses(run: WorkflowRun) -> dict[str, str]:
    return {name: step.status for name, step in steps_of(run).items()}


def step_in(run: WorkflowRun, name: str, status: str, timeout: float = 30) -> StepRun:
    wait_until(lambda: StepRun.objects.get(run=run, name=name).status == status, timeout)
    return StepRun.objects.get(run=run, name=name)


NOOP = "relay-internal/noop"


def ended(event_id: str, timeout: float = 60) -> Event:
    """The event once the worker has read it and, for a workflow's trigger, decided its run."""
    wait_until(
        lambda: (
            Event.objects.filter(pk=event_id)
            .exclude(state="received")
            .exclude(workflow_start="pending")
            .exists()
        ),
        timeout,
    )
    return Event.objects.get(pk=event_id)
