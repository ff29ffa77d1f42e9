"""What the engine can run: step handlers by image name, and connections by type.

The registry names no step kind: each kind registers itself, from its own app's
AppConfig.ready() (the puppet and Slack steps from workflows', `relaysh/core` from
scriptsteps'), so the engine, the API and the admin all see the same list and a new kind
touches only its own module and its app's ready(). A step's image is looked up without its
tag or digest (base.image_name). An image with no handler runs on the fallback, when one is
registered (a container runtime: scriptsteps), else ends its step `failure`, with a message
naming the images that can run.

Connections: `!Connection {type, name}` resolves through connections.services: the value a
step sees (for `puppet`, `{relayAPIURL, token}`), or None when the owner has no such
connection (the step then fails, naming it). It may raise relay.vault.VaultUnavailable: the
engine tries again.
"""

from collections.abc import Callable, Mapping
from typing import Any

from connections import services as connections
from workflows.steps.base import StepHandler, image_name

HandlerFactory = Callable[[], StepHandler]

HANDLERS: dict[str, HandlerFactory] = {}
# Any other image's handler, when one is registered (scriptsteps, with a container runtime).
FALLBACK: list[HandlerFactory] = []


def register(image: str, handler: HandlerFactory) -> None:
    """`image` (any tag or digest) runs on `handler`, e.g. `register(MessageSend.image,
    MessageSend)` from an app's ready(). A second registration of an image replaces the
    first (ready() runs once a process; tests may register again)."""
    HANDLERS[image_name(image)] = handler


def register_fallback(handler: HandlerFactory) -> None:
    """Every image no handler is registered for runs on `handler`."""
    FALLBACK[:] = [handler]


def handler_for(image: str) -> StepHandler | None:
    factory = HANDLERS.get(image_name(image)) or (FALLBACK[0] if FALLBACK else None)
    return factory() if factory is not None else None


def runnable_images() -> list[str]:
    return sorted(HANDLERS)


def resolve_connection(owner_id: int, kind: str, name: str) -> Mapping[str, Any] | None:
    return connections.resolve_connection(owner_id, kind, name)
