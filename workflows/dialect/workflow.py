"""A validated workflow document, as the engine uses it.

Everything is frozen. `spec`, `env`, `when` and binding values are parse trees (see
yamlload): plain data where tags became `$type`/`$fn.` maps; evaluate them with
workflows.dialect.evaluate against a run's data. They are copies owned by this object;
do not mutate them.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

StepKind = Literal["container", "approval"]
TriggerKind = Literal["push", "schedule", "webhook"]


def frozen_map(mapping: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class Parameter:
    name: str
    description: str = ""
    has_default: bool = False
    default: Any = None  # meaningful only when has_default (a default may be null)


@dataclass(frozen=True)
class Container:
    """What a container step (or a webhook trigger) runs."""

    image: str
    spec: Mapping[str, Any] = field(default_factory=frozen_map)
    env: Mapping[str, Any] = field(default_factory=frozen_map)
    input: tuple[str, ...] = ()
    input_file: str = ""
    command: str = ""
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Step:
    name: str
    kind: StepKind
    pointer: str  # where the step is in the document, "#/steps/2"
    container: Container | None = None  # None for approvals
    description: str = ""  # an approval's question
    depends_on: tuple[str, ...] = ()  # as written
    implicit_depends_on: tuple[str, ...] = ()  # steps whose outputs it references
    status_of: tuple[str, ...] = ()  # steps whose status it reads (!Status): after them, any outcome
    when: Any = None  # a condition, a list of them (all must be true), or None

    @property
    def needs(self) -> tuple[str, ...]:
        """The steps that must end `success` before this one may start."""
        return tuple(dict.fromkeys((*self.depends_on, *self.implicit_depends_on)))

    @property
    def after(self) -> tuple[str, ...]:
        """Every step that must have ended before this one is decided."""
        return tuple(dict.fromkeys((*self.needs, *self.status_of)))


@dataclass(frozen=True)
class Trigger:
    name: str
    kind: TriggerKind
    pointer: str
    schedule: str = ""  # cron, for schedule triggers
    container: Container | None = None  # webhook triggers
    binding_parameters: Mapping[str, Any] = field(default_factory=frozen_map)
    binding_key: Any = None
    when: Any = None


@dataclass(frozen=True)
class References:
    """Names the document refers to statically (dynamic references, such as
    `${secrets[parameters.region]}`, cannot be listed)."""

    parameters: frozenset[str] = frozenset()
    secrets: frozenset[str] = frozenset()
    connections: frozenset[tuple[str, str]] = frozenset()  # (type, name)
    outputs: frozenset[tuple[str, str]] = frozenset()  # (step, name)


@dataclass(frozen=True)
class Workflow:
    api_version: str
    summary: str
    description: str
    parameters: Mapping[str, Parameter]
    steps: tuple[Step, ...]
    triggers: tuple[Trigger, ...]
    references: References

    def step(self, name: str) -> Step:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(name)

    @property
    def graph(self) -> Mapping[str, tuple[str, ...]]:
        """Each step's predecessors (explicit, output references, status references)."""
        return MappingProxyType({step.name: step.after for step in self.steps})

    def order(self) -> tuple[str, ...]:
        """The steps in an order that respects the graph (document order where free)."""
        done: dict[str, None] = {}
        pending = list(self.steps)
        while pending:
            ready = [s for s in pending if all(p in done for p in s.after)]
            for step in ready:
                done[step.name] = None
            pending = [s for s in pending if s.name not in done]
        return tuple(done)
