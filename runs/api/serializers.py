"""What the runs API accepts. Unknown fields: rejected when creating a run (a misspelt
`noop` must not turn a dry run into a real one); ignored in state PUTs, because the shipped
bridge echoes fields such as `updated_at` back."""

import json
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
            _one_of("query", {"type": "string", "minLength": 1, "maxLength": 10000}),
            _one_of("node_group", {"type": "string", "minLength": 1, "maxLength": 255}),
            _one_of("application", {"type": "string", "minLength": 1, "maxLength": 255}),
        ]
    }
)
class ScopeSerializer(RejectUnknownFields, serializers.Serializer):
    nodes = certname_list(required=False)
    query = StrictCharField(max_length=10000, required=False)
    node_group = StrictCharField(max_length=255, required=False)
    application = StrictCharField(max_length=255, required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if len(attrs) != 1:
            raise serializers.ValidationError(
                "Give exactly one of nodes, query, node_group or application.", "scope"
            )
        return attrs


class RunCreateSerializer(RejectUnknownFields, serializers.Serializer):
    type = serializers.ChoiceField(choices=RunType.choices, default=RunType.RUN)
    environment = StrictCharField(max_length=255, required=False, validators=[environment_name])
    scope = ScopeSerializer(required=False)
    noop = StrictBooleanField(default=False)
    no_noop = StrictBooleanField(default=False)
    debug = StrictBooleanField(default=False)
    trace = StrictBooleanField(default=False)
    evaltrace = StrictBooleanField(default=False)
    name = StrictCharField(max_length=255, required=False, validators=[task_name])
    params = JSONObjectField(required=False)
    targets = certname_list(required=False)

    def validate_environment(self, value: str) -> str:
        if value in RESERVED_ENVIRONMENTS:
            raise serializers.ValidationError(f"'{value}' is reserved by Puppet.", "reserved")
        return value

    def validate_params(self, value: dict) -> dict:
        if json_size(value) > PARAMS_MAX_BYTES:
            raise serializers.ValidationError(f"Over {PARAMS_MAX_BYTES} bytes.", "max_length")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
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
            if "scope" in attrs:
                errors["scope"] = "Task runs take targets and plan runs take none; not a scope."
            if kind == RunType.TASK_RUN and "targets" not in attrs:
                errors["targets"] = "A task run needs targets."
            if kind == RunType.PLAN_RUN and "targets" in attrs:
                errors["targets"] = "A plan run takes no targets; its plan chooses them."
            attrs.setdefault("params", {})

        for field, message in check_against_connection(attrs, self.context["connection"]).items():
            errors.setdefault(field, message)
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


def check_against_connection(attrs: dict[str, Any], connection: PuppetConnection) -> dict[str, str]:
    """What the connection's Puppet cannot run, by field: its settings decide (platform,
    backend), whatever its bridge sends. A connection whose platform was never set is
    checked against the platform its bridge reported, as before the settings existed; a
    reported backend decides nothing.

    Puppet Enterprise needs an environment (the orchestrator's deploy does). By backend:
    the orchestrator runs everything; Bolt runs on a list of nodes (scope `nodes`) and runs
    tasks (on nodes, or on targets), but the bridge's Bolt backend runs no plans; SSH runs
    only runs on a list of nodes. Open source Puppet with no backend set: only runs on a
    list of nodes (what every backend but the orchestrator can do)."""
    errors: dict[str, str] = {}
    kind, scope = attrs["type"], attrs.get("scope")
    platform, backend = connection.platform_for_runs, connection.backend
    if platform == Platform.PE and not attrs.get("environment"):
        errors["environment"] = "This connection runs Puppet Enterprise: give an environment."
    if not backend and platform == Platform.OSS:
        backend, why = Backend.SSH, "This connection runs open source Puppet"
    else:
        why = f"This connection's backend is {Backend(backend).label}" if backend else ""
    if backend == Backend.SSH:
        if kind != RunType.RUN:
            errors["type"] = (
                f"{why}: only type 'run' (tasks need Bolt or the PE orchestrator, plans the orchestrator)."
            )
        elif scope and "nodes" not in scope:
            errors["scope"] = (
                f"{why}: only the nodes scope (scope `{next(iter(scope))}` needs the PE orchestrator)."
            )
    elif backend == Backend.BOLT:
        if kind == RunType.PLAN_RUN:
            errors["type"] = (
                f"{why}, and the bridge's Bolt backend runs no plans: they need the PE orchestrator."
            )
        elif scope and "nodes" not in scope:
            errors["scope"] = (
                f"{why}: only the nodes scope (scope `{next(iter(scope))}` needs the PE orchestrator)."
            )
    return errors


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
