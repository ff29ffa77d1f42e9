"""What the workflow page says of what a workflow needs from outside: its triggers (where
their events go, and the settings their senders need) and the connections its steps name
(whether each exists, and where to make a missing one, as Relay prompted)."""

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.urls import reverse

from connections import permissions as connection_permissions
from connections.services import connection_types
from relay.api.permissions import is_superuser
from triggers import permissions as trigger_permissions
from triggers import setup
from triggers.models import Schedule, Trigger
from workflows.dialect.workflow import Workflow as ParsedWorkflow
from workflows.models import Workflow

User = AbstractBaseUser | AnonymousUser


@dataclass
class TriggerHelp:
    name: str
    kind: str  # push, webhook, schedule
    url: str = ""  # where its events go
    schedule: str = ""
    next_due: Any = None
    row: Trigger | None = None
    admin_url: str = ""  # its admin page, for whoever may see it there
    snippets: list[tuple[str, str]] = field(default_factory=list)  # (title, text), to its writers
    warning: str = ""


@dataclass
class ConnectionNeed:
    type: str
    name: str
    exists: bool
    known_type: bool = True
    url: str = ""  # its admin page, or the admin's form that makes it (name filled in)
    how: str = ""  # where a missing one is made, for whoever cannot make it here


def _admin_url(user: User, view: str, *args: Any) -> str:
    """An admin page, for staff (the admin admits no one else)."""
    return reverse(f"admin:{view}", args=args) if user.is_active and user.is_staff else ""


def triggers_of(user: User, workflow: Workflow, document: ParsedWorkflow) -> list[TriggerHelp]:
    """The document's triggers in its order, with what each sender needs. The settings are
    for those who may change the trigger (who hold or regenerate its token); anyone who sees
    the workflow sees where the events go."""
    rows = {t.name: t for t in Trigger.objects.filter(workflow=workflow).select_related("workflow")}
    schedules = {s.name: s for s in Schedule.objects.filter(workflow=workflow)}
    shown = []
    for spec in document.triggers:
        if spec.kind == "schedule":
            schedule = schedules.get(spec.name)
            shown.append(
                TriggerHelp(
                    spec.name,
                    spec.kind,
                    schedule=spec.schedule,
                    next_due=schedule.next_due if schedule else None,
                )
            )
            continue
        trigger = rows.get(spec.name)
        if trigger is None or trigger.kind != spec.kind:
            continue  # the revision that makes it is being saved
        help = TriggerHelp(
            spec.name,
            spec.kind,
            url=trigger.webhook_url() or setup.events_url(),
            row=trigger,
        )
        if trigger_permissions.may(user, trigger_permissions.Action.VIEW, trigger):
            help.admin_url = _admin_url(user, "triggers_trigger_change", trigger.pk)
        if trigger_permissions.may(user, trigger_permissions.Action.CHANGE, trigger):
            if trigger.kind == "webhook":
                help.snippets = [("Send an event with curl", setup.webhook_curl(trigger))]
            else:
                help.snippets = [
                    (
                        "puppetlabs-relay's report processor (the token in a file)",
                        setup.report_processor_settings(trigger),
                    ),
                    (
                        "Puppet's own http processor (the token in the URL)",
                        setup.http_processor_settings(trigger),
                    ),
                ]
        if trigger.kind == "webhook" and not trigger.passes_through:
            help.warning = (
                f"Its image {trigger.image} reshapes requests in a container, which this service "
                "does not run: its URL refuses every event (409)."
            )
        shown.append(help)
    return shown


def connections_of(user: User, workflow: Workflow, document: ParsedWorkflow) -> list[ConnectionNeed]:
    """The connections the document names (`${connections.puppet['prod']}`, `!Connection`),
    each looked up among the workflow owner's, as a run looks it up. A name computed at run
    time (`connections.puppet[parameters.x]`) cannot be listed."""
    types = connection_types()
    wanted = sorted(document.references.connections)
    found: dict[tuple[str, str], Any] = {}
    for kind in {kind for kind, _ in wanted if kind in types}:
        names = [name for k, name in wanted if k == kind]
        for connection in types[kind]._default_manager.filter(owner_id=workflow.owner_id, name__in=names):
            found[(kind, connection.name)] = connection
    needs = []
    for kind, name in wanted:
        model = types.get(kind)
        connection = found.get((kind, name))
        need = ConnectionNeed(kind, name, exists=connection is not None, known_type=model is not None)
        if model is None:
            need.how = f"There is no connection type {kind}: one of {', '.join(sorted(types))}."
        elif connection is not None:
            if connection_permissions.may(user, connection_permissions.Action.VIEW, connection):
                opts = model._meta
                need.url = _admin_url(user, f"{opts.app_label}_{opts.model_name}_change", connection.pk)
        else:
            need.url, need.how = _where_to_make(user, workflow, model, kind, name)
        needs.append(need)
    return needs


def _where_to_make(user: User, workflow: Workflow, model: Any, kind: str, name: str) -> tuple[str, str]:
    """The admin's add form with the name (and for a superuser the owner) filled in, for
    whoever may make the owner's connection there; else who can make it, and how."""
    opts = model._meta
    mine = user.pk == workflow.owner_id or is_superuser(user)
    if mine and user.is_staff and user.has_perm(f"{opts.app_label}.add_{opts.model_name}"):
        url = reverse(f"admin:{opts.app_label}_{opts.model_name}_add")
        initial = {"name": name, **({"owner": workflow.owner_id} if user.pk != workflow.owner_id else {})}
        return f"{url}?{urlencode(initial)}", ""
    who = "You can" if mine else f"Its owner, {workflow.owner.get_username()}, can"
    return "", f"{who} make it with the API: POST /api/connections/{kind}/ with the name {name}."
