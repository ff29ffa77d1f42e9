"""The scope preview on an approval, on the run page and the admin's approval page (issue
21 §3): for each `puppet-run` step that waits on the approval, which nodes its scope names
and which of those the connection's inventory does not know, or knows as stale, deactivated
or expired (inventory.scope.preview), next to the dry run's evidence. Only what the document
says as it is written: a connection or scope computed from expressions (an output, a
parameter) is known when the step starts, and the page says so rather than guess."""

from typing import Any

from inventory.scope import preview
from puppet_connection.models import PuppetConnection
from workflows.dialect.workflow import Workflow
from workflows.models import WorkflowRun
from workflows.steps.puppet_run import PuppetRun

COMPUTED = "computed when the step starts: no preview before it"


def scope_previews(run: WorkflowRun, document: Workflow, approval: str) -> list[tuple[str, Any]]:
    """(step name, its preview, or a sentence saying why there is none), for the puppet-run
    steps after `approval`."""
    found = []
    for step in document.steps:
        container = step.container
        if approval not in step.after or container is None or container.image != PuppetRun.image:
            continue
        spec = dict(container.spec)
        connection = _connection(run, spec.get("connection"))
        scope = spec.get("scope")
        if connection is None:
            found.append((step.name, f"its connection is {COMPUTED}, or no puppet connection of the owner's"))
        elif not isinstance(scope, dict) or _computed(scope):
            found.append((step.name, f"its scope is {COMPUTED}"))
        else:
            found.append((step.name, preview(connection, scope)))
    return found


def _connection(run: WorkflowRun, tree: Any) -> PuppetConnection | None:
    """The owner's puppet connection a literal `!Connection {type: puppet, name: …}` names."""
    if not (isinstance(tree, dict) and tree.get("$type") == "Connection" and tree.get("type") == "puppet"):
        return None
    name = tree.get("name")
    if not isinstance(name, str):
        return None
    return PuppetConnection.objects.filter(owner_id=run.workflow.owner_id, name=name).first()


def _computed(tree: Any) -> bool:
    """Whether the tree holds anything evaluated (a tagged node, a `${…}` template)."""
    if isinstance(tree, dict):
        return "$type" in tree or any(_computed(value) for value in tree.values())
    if isinstance(tree, list):
        return any(_computed(value) for value in tree)
    return isinstance(tree, str) and "${" in tree
