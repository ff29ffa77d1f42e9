"""The inventory's filters, one reading for the API and the admin: `status` (the last
report's), `state` (active, stale, deactivated, expired), `certname` (its beginning), and
`fact.<dotted path>=<value>` for the facts the connection's allow-list names. A fact it
does not name is an error (FilterError, the API's 400): an empty page would say no node has
it, when the bridge never sent it."""

from collections.abc import Mapping

from django.db.models import QuerySet
from django.db.models.fields.json import KeyTextTransform

from inventory.models import Inventory, Node, ReportStatus, State, state_filter
from puppet_connection.models import PuppetConnection

STATUSES = ("changed", "unchanged", "failed", "none")


class FilterError(ValueError):
    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter


def fact_paths(connection: PuppetConnection) -> list[str]:
    inventory = Inventory.objects.filter(connection=connection).first()
    return list(inventory.fact_paths) if inventory else []


def filter_nodes(connection: PuppetConnection, params: Mapping[str, str]) -> QuerySet[Node]:
    nodes = Node.objects.filter(connection=connection)
    status = params.get("status")
    if status:
        if status not in STATUSES:
            raise FilterError("status", f"One of {', '.join(STATUSES)} (none: no report yet).")
        nodes = nodes.filter(report_status=ReportStatus.NONE if status == "none" else status)
    state = params.get("state")
    if state:
        if state not in State.values:
            raise FilterError("state", f"One of {', '.join(State.values)}.")
        nodes = nodes.filter(state_filter(state))
    certname = params.get("certname")
    if certname:
        nodes = nodes.filter(certname__startswith=certname)
    allowed = None
    aliases: list[str] = []
    for key, value in params.items():
        if not key.startswith("fact."):
            continue
        path = key.removeprefix("fact.")
        allowed = fact_paths(connection) if allowed is None else allowed
        if path not in allowed:
            named = ", ".join(allowed) or "none yet (the bridge has not synced)"
            raise FilterError(key, f"{path!r} is not a fact the bridge's allow-list sends: {named}.")
        # Compared as text: `fact.os.release.major=12` finds the number 12 and the string "12".
        alias = f"fact_{len(aliases)}"
        aliases.append(alias)
        nodes = nodes.alias(**{alias: KeyTextTransform(path, "facts")}).filter(**{alias: value})
    return nodes
