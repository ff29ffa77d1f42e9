"""What the runs API accepts. Unknown fields: rejected when creating a run (a misspelt
`noop` must not turn a dry run into a real one); ignored in state PUTs, because the shipped
bridge echoes fields such as `updated_at` back."""

import json
import re
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.validators import RegexValidator
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from puppet_connection.models import Backend, Platform, PuppetConnection
from relay.api.serializers import (
    JSONObjectField,
    RejectUnknownFields,
    StoredJSONField,
    StrictBooleanField,
    StrictCharField,
)
from runs import rollouts
from runs.models import CLIENT_OUTCOMES, RunType, Status

# Puppet certnames: lowercase letters, digits, '.', '_' and '-'.
certname = RegexValidator(
    r"^[a-z0-9][a-z0-9._-]*$", "Not a valid certname (lowercase letters, digits, '.', '_', '-')."
)
# Puppet environment names: lowercase letters, digits and underscores.
environment_name = RegexValidator(
    r"^[a-z0-9_]+$", "Not a valid environment name (lowercase letters, digits, '_')."
)
RESERVED_ENVIRONMENTS = {"main", "master", "agent", "user"}
# Task and plan names: `module` or `module::name`.
task_name = RegexValidator(r"^[a-z][a-z0-9_]*(::[a-z][a-z0-9_]*)*$", "Not a valid task or plan name.")
PARAMS_MAX_BYTES = 64 * 1024


def certname_list(**kwargs: Any) -> serializers.ListField:
    return serializers.ListField(
        child=StrictCharField(max_length=255, validators=[certname]),
        allow_empty=False,
        max_length=settings.RUN_MAX_NODES,
        **kwargs,
    )


def json_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")).encode())


QUERY_MAX = 10000


class QueryField(StoredJSONField):
    """A PuppetDB query, as PE's orchestrator takes one: PQL text
    (`inventory[certname] { facts.os.family = "Debian" }`) or PuppetDB's AST, a JSON array
    (`["=", ["fact", "kernel"], "Linux"]`). PuppetDB judges it (the orchestrator, or the
    bridge's PuppetDB): here only its shape and size."""

    default_error_messages = {
        "invalid_query": "PQL text, or a PuppetDB AST query (a non-empty JSON array).",
        "too_long": f"Over {QUERY_MAX} characters.",
    }

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, str):
            return StrictCharField(max_length=QUERY_MAX).run_validation(data)
        if not isinstance(data, list) or not data:
            self.fail("invalid_query")
        value = super().to_internal_value(data)
        if json_size(value) > QUERY_MAX:
            self.fail("too_long")
        return value


def _one_of(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {name: schema}, "required": [name], "additionalProperties": False}


# The schema says "exactly one of", as validate() does: generated clients and the API fuzz
# (tests/test_fuzz_api.py) then build scopes that are valid.
@extend_schema_field(
    {
        "oneOf": [
            _one_of(
                "nodes",
                {
                    "type": "array",
                    "items": {"type": "string", "pattern": certname.regex.pattern, "maxLength": 255},
                    "minItems": 1,
                    "maxItems": settings.RUN_MAX_NODES,
                },
            ),
            _one_of(
                "query",
                {
                    "oneOf": [
                        {"type": "string", "minLength": 1, "maxLength": QUERY_MAX},
                        {"type": "array", "minItems": 1, "items": {}},
                    ]
                },
            ),
            _one_of("node_group", {"type": "string", "minLength": 1, "maxLength": 255}),
            _one_of("application", {"type": "string", "minLength": 1, "maxLength": 255}),
        ]
    }
)
class ScopeSerializer(RejectUnknownFields, serializers.Serializer):
    nodes = certname_list(required=False)
    query = QueryField(required=False)
    node_group = StrictCharField(max_length=255, required=False)
    application = StrictCharField(max_length=255, required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if len(attrs) != 1:
            raise serializers.ValidationError(
                "Give exactly one of nodes, query, node_group or application.", "scope"
            )
        return attrs


# Credentials a Bolt target object can carry (its `config`): a run is kept in the database
# and shown to the bridge, so they belong in the bridge's own Bolt inventory or PE, not here.
TARGET_SECRET_KEYS = {"password", "sudo-password", "private-key-content", "key-data", "token"}
TASK_SCOPES = ("nodes", "query", "node_group")  # what PE's command/task takes


class TargetField(serializers.Field):
    """One of a task run's `targets`: a Bolt target object (the published shape), or a
    certname (this service's task runs before scopes, turned into a scope at creation)."""

    default_error_messages = {"invalid": "A Bolt target object, or a certname."}

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, str):
            return StrictCharField(max_length=255, validators=[certname]).run_validation(data)
        if not isinstance(data, dict):
            self.fail("invalid")
        secret = _secret_key(data)
        if secret:
            raise serializers.ValidationError(
                f"`{secret}` is a credential: give it to the bridge (its Bolt inventory, or PE), "
                "not to a run, which is stored and shown.",
                "secret",
            )
        return StoredJSONField().run_validation(data)

    def to_representation(self, value: Any) -> Any:
        return value


def _secret_key(value: Any) -> str | None:
    pending = [value]  # a loop, not recursion: the depth of a document is the client's
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            for key in item:
                if str(key).lower() in TARGET_SECRET_KEYS:
                    return str(key)
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return None


@extend_schema_field(
    {
        "type": "array",
        "maxItems": settings.RUN_MAX_NODES,
        "items": {
            "oneOf": [
                {"type": "object"},
                {"type": "string", "pattern": certname.regex.pattern, "maxLength": 255},
            ]
        },
    }
)
class TargetsField(serializers.ListField):
    child = TargetField()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_length=settings.RUN_MAX_NODES, **kwargs)

    def to_internal_value(self, data: Any) -> list[Any]:
        targets = super().to_internal_value(data)
        if json_size(targets) > PARAMS_MAX_BYTES:
            raise serializers.ValidationError(f"Over {PARAMS_MAX_BYTES} bytes.", "max_length")
        return targets


def task_run_shape(attrs: dict[str, Any]) -> dict[str, str]:
    """A task run as the published task-run-start sends it: `scope` (nodes, query or
    node_group) and `targets`, Bolt target objects (optional). The shape this service took
    before, certnames as `targets` and no scope, is still taken and made that: scope
    `{nodes: targets}`, no targets. Returns the errors; fixes `attrs` in place."""
    targets = attrs.get("targets") or []
    names = [t for t in targets if isinstance(t, str)]
    if "scope" not in attrs:
        if targets and len(names) == len(targets):
            attrs["scope"], attrs["targets"] = {"nodes": list(dict.fromkeys(names))}, []
            return {}
        return {"scope": "A task run needs a scope: nodes, query or node_group."}
    errors = {}
    kind = next(iter(attrs["scope"]))
    if kind not in TASK_SCOPES:
        errors["scope"] = f"A task run's scope is one of {', '.join(TASK_SCOPES)}; not {kind}."
    if names:
        errors["targets"] = "With a scope, targets are Bolt target objects, not certnames."
    attrs.setdefault("targets", [])
    return errors


PERCENT = re.compile(r"^([0-9]{1,3})%$")
DURATION = re.compile(r"^([0-9]{1,6})(s|m|h)$")
SECONDS = {"s": 1, "m": 60, "h": 3600}


def whole_number(data: Any) -> int | None:
    """A JSON whole number (a float that is one too: numbers from workflow expressions are
    floats, as in Go); None for anything else, booleans included."""
    if isinstance(data, float) and data.is_integer():
        data = int(data)
    return data if isinstance(data, int) and not isinstance(data, bool) else None


@extend_schema_field(
    {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": PERCENT.pattern}]}
)
class CountField(serializers.Field):
    """A number of nodes (10), or a percentage of the scope's nodes ("20%")."""

    default_error_messages = {
        "invalid": 'A whole number of nodes, or a percentage of them as a string ("20%").',
        "low": "At least {lowest}.",
        "high": f"At most {settings.RUN_MAX_NODES} (RUN_MAX_NODES).",
        "percent": "A percentage from {lowest}% to 100%.",
    }

    def __init__(self, lowest: int, **kwargs: Any) -> None:
        self.lowest = lowest
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> int | str:
        number = whole_number(data)
        if number is not None:
            if number < self.lowest:
                self.fail("low", lowest=self.lowest)
            if number > settings.RUN_MAX_NODES:
                self.fail("high")
            return number
        match = PERCENT.match(data) if isinstance(data, str) else None
        if match is None:
            self.fail("invalid")
        if not self.lowest <= int(match[1]) <= 100:
            self.fail("percent", lowest=self.lowest)
        return f"{int(match[1])}%"

    def to_representation(self, value: Any) -> Any:
        return value


@extend_schema_field(
    {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": DURATION.pattern}]}
)
class PauseField(serializers.Field):
    """Seconds between batches: a number (30), or a string with its unit ("30s", "5m", "1h")."""

    default_error_messages = {
        "invalid": 'Seconds (30), or a duration with its unit: "30s", "5m", "1h".',
        "range": f"From 0 to {settings.ROLLOUT_MAX_PAUSE} seconds.",
    }

    def to_internal_value(self, data: Any) -> int:
        seconds = whole_number(data)
        if seconds is None:
            match = DURATION.match(data) if isinstance(data, str) else None
            if match is None:
                self.fail("invalid")
            seconds = int(match[1]) * SECONDS[match[2]]
        if not 0 <= seconds <= settings.ROLLOUT_MAX_PAUSE:
            self.fail("range")
        return seconds

    def to_representation(self, value: Any) -> Any:
        return value


@extend_schema_field({"type": "integer", "minimum": 0, "maximum": settings.RUN_MAX_NODES})
class CanaryField(serializers.Field):
    default_error_messages = {"invalid": "A whole number of nodes, 0 (no canary) or more."}

    def to_internal_value(self, data: Any) -> int:
        number = whole_number(data)
        if number is None or not 0 <= number <= settings.RUN_MAX_NODES:
            self.fail("invalid")
        return number

    def to_representation(self, value: Any) -> Any:
        return value


class RolloutSerializer(RejectUnknownFields, serializers.Serializer):
    """`rollout: {canary: 1, batch: 10 | "20%", max_failures: 0 | "5%", pause: 30s}`: the
    canary's nodes first (all of them must succeed), then `batch` nodes at a time, stopping
    before the next batch once more than `max_failures` nodes failed in all, `pause` between
    batches. Percentages are of the scope's nodes, rounded down (a batch at least 1)."""

    canary = CanaryField(default=0)
    batch = CountField(lowest=1)
    max_failures = CountField(lowest=0, default=0)
    pause = PauseField(default=0)


class RunCreateSerializer(RejectUnknownFields, serializers.Serializer):
    type = serializers.ChoiceField(choices=RunType.choices, default=RunType.RUN)
    # null is no environment: the published task-run-start sends `environment: null` when
    # its spec has none.
    environment = StrictCharField(
        max_length=255, required=False, allow_null=True, validators=[environment_name]
    )
    scope = ScopeSerializer(required=False)
    noop = StrictBooleanField(default=False)
    no_noop = StrictBooleanField(default=False)
    debug = StrictBooleanField(default=False)
    trace = StrictBooleanField(default=False)
    evaltrace = StrictBooleanField(default=False)
    name = StrictCharField(max_length=255, required=False, validators=[task_name])
    params = JSONObjectField(required=False)
    targets = TargetsField(required=False)
    rollout = RolloutSerializer(required=False)

    def validate_environment(self, value: str) -> str:
        if value in RESERVED_ENVIRONMENTS:
            raise serializers.ValidationError(f"'{value}' is reserved by Puppet.", "reserved")
        return value

    def validate_params(self, value: dict) -> dict:
        if json_size(value) > PARAMS_MAX_BYTES:
            raise serializers.ValidationError(f"Over {PARAMS_MAX_BYTES} bytes.", "max_length")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("environment") is None:
            attrs.pop("environment", None)
        errors: dict[str, str] = {}
        kind = attrs["type"]
        if attrs["noop"] and attrs["no_noop"]:
            errors["no_noop"] = "noop and no_noop cannot both be true."
        if kind == RunType.RUN:
            if "scope" not in attrs:
                errors["scope"] = "A run needs a scope."
            for field in ("name", "params", "targets"):
                if field in attrs:
                    errors[field] = "Only task and plan runs take this."
        else:
            if "name" not in attrs:
                errors["name"] = f"A {kind} needs the name of its {kind.split('-')[0]}."
            if kind == RunType.TASK_RUN:
                errors.update(task_run_shape(attrs))
            else:
                if "scope" in attrs:
                    errors["scope"] = "A plan run takes no scope; its plan chooses its targets."
                if "targets" in attrs:
                    errors["targets"] = "A plan run takes no targets; its plan chooses them."
            attrs.setdefault("params", {})

        for field, message in check_against_connection(attrs, self.context["connection"]).items():
            errors.setdefault(field, message)
        if "rollout" in attrs and not errors:
            errors.update(rollout_plan(attrs, self.context["connection"], self.context.get("wait_for_query")))
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


def rollout_plan(
    attrs: dict[str, Any], connection: PuppetConnection, wait_for_query: bool = False
) -> dict[str, Any]:
    """A run with a rollout: its nodes (from its scope) and its plan, put in `attrs["rollout"]`
    for Run.create_for. Returns the errors. `wait_for_query`: a query the bridge has been
    asked to resolve raises rollouts.QueryAsked (the rest is valid), not an error."""
    if attrs["type"] != RunType.RUN:
        return {"rollout": f"Only runs (type 'run') take a rollout; not a {attrs['type']}."}
    nodes = rollouts.nodes_of(connection, attrs["scope"])
    if isinstance(nodes, rollouts.NotResolvable):
        if nodes.asked and wait_for_query:
            raise rollouts.QueryAsked(nodes.reason)
        return {"scope": nodes.reason}
    spec = dict(attrs["rollout"])
    if spec["canary"] > len(nodes):
        return {"rollout": {"canary": f"More than the scope's {len(nodes)} nodes."}}
    attrs["rollout"] = {"nodes": nodes, "plan": rollouts.plan(spec, len(nodes))}
    return {}


def check_against_connection(attrs: dict[str, Any], connection: PuppetConnection) -> dict[str, str]:
    """What the connection's Puppet cannot run, by field: its settings decide (platform,
    backend), whatever its bridge sends. A setting never made is filled, as before the
    settings existed, by what the bridge reported: its platform, and, on open source
    Puppet, whether its backend is Bolt (which also runs tasks).

    Puppet Enterprise needs an environment for a run (the orchestrator's deploy does); its
    task and plan commands default to `production`, and the published task-run-start and
    plan-run-start send none when their spec has none, so those may leave it out. By backend:
    the orchestrator runs everything; Bolt runs runs and task runs on a list of nodes (scope
    `nodes`), and no plans (the bridge's Bolt backend runs none); SSH runs only runs on a
    list of nodes. Open source Puppet with no backend set or reported: as SSH (what every
    backend but the orchestrator can do). Bolt and SSH also take a PuppetDB `query` scope
    when the connection says its bridge has PuppetDB (`puppetdb`): the bridge resolves it."""
    errors: dict[str, str] = {}
    kind, scope = attrs["type"], attrs.get("scope")
    platform, backend = connection.platform_for_runs, connection.backend
    if platform == Platform.PE and kind == RunType.RUN and not attrs.get("environment"):
        errors["environment"] = "This connection runs Puppet Enterprise: give a run an environment."
    if backend:
        why = f"This connection's backend is {Backend(backend).label}"
    elif platform == Platform.OSS:
        backend = Backend.BOLT if connection.reported_backend == Backend.BOLT else Backend.SSH
        why = "This connection runs open source Puppet" + (" with Bolt" if backend == Backend.BOLT else "")
    if backend == Backend.SSH:
        if kind != RunType.RUN:
            errors["type"] = (
                f"{why}: only type 'run' (tasks need Bolt or the PE orchestrator, plans the orchestrator)."
            )
        elif scope and not oss_scope_ok(scope, connection):
            errors["scope"] = oss_scope_error(why, scope, connection)
    elif backend == Backend.BOLT:
        if kind == RunType.PLAN_RUN:
            errors["type"] = (
                f"{why}, and the bridge's Bolt backend runs no plans: they need the PE orchestrator."
            )
        elif scope and not oss_scope_ok(scope, connection):
            errors["scope"] = oss_scope_error(why, scope, connection)
    return errors


def oss_scope_ok(scope: dict[str, Any], connection: PuppetConnection) -> bool:
    """What Bolt and SSH run on: a list of nodes; and a PuppetDB query, which the bridge
    resolves to nodes, when the connection says its bridge has PuppetDB."""
    return "nodes" in scope or ("query" in scope and connection.puppetdb)


def oss_scope_error(why: str, scope: dict[str, Any], connection: PuppetConnection) -> str:
    kind = next(iter(scope))
    if kind == "query":
        return (
            f"{why}: only the nodes scope (scope `query` needs the PE orchestrator, or PuppetDB: set the"
            " connection's puppetdb when its bridge has puppetdb_url)."
        )
    allowed = "nodes and query scopes" if connection.puppetdb else "nodes scope"
    return f"{why}: only the {allowed} (scope `{kind}` needs the PE orchestrator)."


class AcceptSerializer(serializers.Serializer):
    lease_id = serializers.UUIDField(required=False)


class StateSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=Status.choices)
    next_update_before = serializers.DateTimeField(required=False)
    job_id = StrictCharField(max_length=255, required=False, allow_blank=True, allow_null=True)
    outcome = serializers.ChoiceField(choices=CLIENT_OUTCOMES, required=False, allow_null=True)
    run_results = StoredJSONField(required=False, allow_null=True)
    lease_id = serializers.UUIDField(required=False, allow_null=True)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        status = attrs["status"]
        if status == Status.IN_PROGRESS:
            due = attrs.get("next_update_before")
            if due is None:
                raise serializers.ValidationError(
                    {"next_update_before": "In progress needs the time of the next update."}
                )
            now = timezone.now()
            if due <= now:
                raise serializers.ValidationError({"next_update_before": "Must be in the future."})
            if due > now + timedelta(seconds=settings.RUN_MAX_HEARTBEAT_INTERVAL):
                raise serializers.ValidationError(
                    {"next_update_before": f"At most {settings.RUN_MAX_HEARTBEAT_INTERVAL} seconds ahead."}
                )
        if status != Status.COMPLETE:
            for field in ("outcome", "run_results"):
                if attrs.get(field) is not None:
                    raise serializers.ValidationError({field: "Only a complete state has this."})
        return attrs
