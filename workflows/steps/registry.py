"""What the engine can run: step handlers by image name, and connections by type.

A step's image is looked up without its tag or digest (base.image_name). Handlers are
registered by the modules that define them, imported from `load()` below, so that the
engine, the API and the admin all see the same list. An image with no handler ends its step
`failure`, with a message naming the images that can run.

Connections: `!Connection {type, name}` resolves through connections.services: the value a
step sees (for `puppet`, `{relayAPIURL, token}`), or None when the owner has no such
connection (the step then fails, naming it). It may raise relay.vault.VaultUnavailable: the
engine tries again.
"""

from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings

from connections import services as connections
from workflows.steps.base import StepHandler, image_name

HandlerFactory = Callable[[], StepHandler]

HANDLERS: dict[str, HandlerFactory] = {}
# Any other image, when a container runtime is configured (scriptsteps.handler sets it).
FALLBACK: list[HandlerFactory] = []


def register(image: str) -> Callable[[HandlerFactory], HandlerFactory]:
    """Decorator: `@register("relaysh/slack-step-message-send")` on a handler class."""

    def add(factory: HandlerFactory) -> HandlerFactory:
        HANDLERS[image_name(image)] = factory
        return factory

    return add


_loaded = False


def load() -> None:
    """Import the modules that register handlers (once). Called from WorkflowsConfig.ready()."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    from workflows.steps.handlers import HANDLERS as NATIVE  # the published images' steps

    HANDLERS.update(NATIVE)
    from scriptsteps import handler as scripts  # relaysh/core, and other images in containers

    if settings.STEP_CONTAINER_RUNTIME:
        FALLBACK[:] = [scripts.ContainerStep]
    if settings.WORKFLOW_NOOP_STEPS:
        from workflows.steps import noop  # noqa: F401  (registers on import)


def handler_for(image: str) -> StepHandler | None:
    factory = HANDLERS.get(image_name(image)) or (FALLBACK[0] if FALLBACK else None)
    return factory() if factory is not None else None


def runnable_images() -> list[str]:
    return sorted(HANDLERS)


def resolve_connection(owner_id: int, kind: str, name: str) -> Mapping[str, Any] | None:
    return connections.resolve_connection(owner_id, kind, name)
