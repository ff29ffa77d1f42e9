"""`relaysh/puppet-step-plan-run-start`: asks for a Puppet plan run; outputs `id`, and
`jobID` once known (relay-integrations/relay-puppet, steps/plan-run-start).

spec: connection (puppet), name (the plan), params, environment."""

from collections.abc import Mapping
from typing import Any

from workflows.steps.puppet import StartsARun, optional

FIELDS = {"environment": "environment", "name": "name", "params": "params"}


class PlanRunStart(StartsARun):
    image = "relaysh/puppet-step-plan-run-start"
    known = {"connection", *FIELDS}

    def body(self, spec: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        return {"type": "plan-run", **optional(spec, FIELDS)}, FIELDS
