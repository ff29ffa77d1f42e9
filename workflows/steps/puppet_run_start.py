"""`relaysh/puppet-step-run-start`: asks for a Puppet run; outputs `id`, and `jobID` once
known (relay-integrations/relay-puppet, steps/run-start).

spec: connection (puppet), scope (`nodes`, `query`, `node_group` or `application`),
environment, noop, no_noop, debug, trace, evaltrace."""

from collections.abc import Mapping
from typing import Any

from workflows.steps.puppet import StartsARun, optional

FIELDS = {name: name for name in ("environment", "scope", "noop", "no_noop", "debug", "trace", "evaltrace")}


class RunStart(StartsARun):
    image = "relaysh/puppet-step-run-start"
    known = {"connection", *FIELDS}

    def body(self, spec: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        return {"type": "run", **optional(spec, FIELDS)}, FIELDS
