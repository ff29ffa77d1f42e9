"""`relaysh/puppet-step-task-run-start`: asks for a Puppet task run; outputs `id`, and
`jobID` once known (relay-integrations/relay-puppet, steps/task-run-start).

spec, as the published spec schema has it: connection (puppet), scope (one of nodes, query,
node_group; required), name (the task; required), params, noop, environment, and targets
(Bolt target objects, optional). The run is the body the published step POSTs."""

from collections.abc import Mapping
from typing import Any

from workflows.steps.puppet import StartsARun, optional
from workflows.steps.spec import SpecError

FIELDS = {
    "environment": "environment",
    "scope": "scope",
    "name": "name",
    "params": "params",
    "noop": "noop",
    "targets": "targets",
}


class TaskRunStart(StartsARun):
    image = "relaysh/puppet-step-task-run-start"
    known = {"connection", *FIELDS}

    def body(self, spec: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        if spec.get("scope") is None:
            # Required by the published schema; the API alone would also take certnames as
            # targets without one, which the published step never sends.
            raise SpecError(
                "spec.scope: give the task's nodes: {nodes: [...]}, {query: ...} or {node_group: ...}."
            )
        return {"type": "task-run", **optional(spec, FIELDS)}, FIELDS
