"""The contract between the engine and the steps it runs itself (by image name).

The engine owns every state transition of a step run; a handler only says what happened.
`start` is called exactly once per step run (the engine claims the step with a
compare-and-set before calling it). A handler that must wait for something outside
(a Puppet run, a Slack answer) returns `Wait`: the engine then holds no worker, and calls
`check` again when what the step waits for changes (`Wait.wake_on`) or at `Wait.recheck_at`
at the latest. `cancel` is called once when the run is cancelled while the step waits.

Handlers never raise for a failure of the step itself (a Puppet run that failed, a refused
Slack post): they return `Done(success=False, message=…)`. An exception means the worker
could not do its job (database, Vault or broker trouble): the engine retries it, a bounded
number of times, and then fails the step with the exception's message.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol


@dataclass(frozen=True)
class Done:
    """The step ended: `success` or `failure`, with its outputs and a message for people;
    or, with `system_error`, `system-error`: the machine could not run it (not the step's
    doing), which stops its run."""

    success: bool
    outputs: Mapping[str, Any] = field(default_factory=dict)
    message: str = ""
    system_error: bool = False


@dataclass(frozen=True)
class Wait:
    """The step goes on without a worker. `state` is kept for the next `check` (JSON);
    `outputs` are published at once (e.g. run-start's `id` before the run ends); `wake_on`
    names what wakes it early, e.g. ("puppet-run", "<run uuid>")."""

    recheck_at: datetime
    state: Mapping[str, Any] = field(default_factory=dict)
    outputs: Mapping[str, Any] = field(default_factory=dict)
    wake_on: tuple[str, str] | None = None


Outcome = Done | Wait


@dataclass(frozen=True)
class StepContext:
    """What a handler may see: its own step run only."""

    step_run_id: str
    run_id: str
    owner_id: int  # the workflow's owner: connections and secrets are looked up as theirs
    step_name: str
    image: str
    spec: Mapping[str, Any]  # evaluated: parameters, secrets, connections, outputs resolved
    env: Mapping[str, Any]
    state: Mapping[str, Any]  # what the last Wait kept ({} on start)
    started_at: datetime
    # A script step's program (scriptsteps/): its `input` lines, or `command` and `args`.
    input: tuple[str, ...] = ()
    command: str = ""
    args: tuple[str, ...] = ()
    # The values it received from secrets and connections: masked wherever it shows them.
    secrets: tuple[str, ...] = field(default=(), repr=False)


class StepHandler(Protocol):
    def start(self, ctx: StepContext) -> Outcome: ...

    def check(self, ctx: StepContext) -> Outcome: ...

    def cancel(self, ctx: StepContext) -> None: ...


# image name without tag or digest -> handler; filled by workflows.steps.registry
Registry = Mapping[str, Callable[[], StepHandler]]


def image_name(image: str) -> str:
    """`relaysh/puppet-step-run-start:latest` -> `relaysh/puppet-step-run-start` (tags and
    digests are tolerated: the engine runs its own implementation of each image)."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: len(name) - len(last)] + last.split(":", 1)[0]
    return name
