"""`relaysh/puppet-step-task-run-start`: asks for a Puppet task run; outputs `id`, and
`jobID` once known (relay-integrations/relay-puppet, steps/task-run-start).

spec: connection (puppet), name (the task), params, noop, environment, and the nodes:
`targets` (certnames, or Bolt target objects with a `name` or `uri`) or, when there are no
targets, `scope.nodes`. The published step sends both and its bridge reads the targets;
this service's task runs take certnames as targets and no scope."""

from collections.abc import Mapping
from typing import Any

from workflows.steps.puppet import StartsARun, optional
from workflows.steps.spec import SpecError

FIELDS = {"environment": "environment", "name": "name", "params": "params", "noop": "noop"}


def target_names(targets: Any) -> Any:
    """Bolt target objects as their names; anything else as it is, for the API to judge."""
    if not isinstance(targets, list):
        return targets
    names = []
    for target in targets:
        if isinstance(target, Mapping):
            target = target.get("name") or target.get("uri")
        names.append(target)
    return names


class TaskRunStart(StartsARun):
    image = "relaysh/puppet-step-task-run-start"
    known = {"connection", "scope", "targets", *FIELDS}

    def body(self, spec: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        body = {"type": "task-run", **optional(spec, FIELDS)}
        names = dict(FIELDS)
        scope = spec.get("scope")
        if spec.get("targets"):
            body["targets"], names["targets"] = target_names(spec["targets"]), "targets"
        elif isinstance(scope, Mapping) and scope.get("nodes") is not None:
            body["targets"], names["targets"] = scope["nodes"], "scope.nodes"
        else:
            raise SpecError("spec.targets: give the task's nodes, as targets or as scope.nodes.")
        return body, names
