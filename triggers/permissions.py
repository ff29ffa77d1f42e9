"""Who may do what to a trigger and its events: one rule for the admin and the API alike
(triggers.admin, triggers.api.views).

A trigger's token is a credential and its Slack webhook URL a destination: whoever holds the
token posts reports as the trigger's owner, and each report it matches is summed up to the
owner's Slack channel. So writing a trigger of one's own (a standalone push trigger, one no
workflow declares) is its owner's alone (and a superuser's): regenerating its token (the answer
shows the new one), replacing its Slack webhook URL (the owner's reports would go to another
channel), its filters (which reports are summed up, or none), its name and its description,
one rule for every write. Its owner is chosen once, when it is made (by a superuser, for
someone else), and changed by no one afterwards.

A workflow's trigger starts runs as the workflow's owner: it is written as the workflow's
document is (workflows.permissions: its owner or a superuser), and deleted by no one here (a
revision that no longer declares it deletes it).

Other staff's Django permissions give what sends nothing anywhere as anyone: seeing a trigger
(`view_trigger`, or `change_trigger`, which implies view as everywhere in the admin), never
its token or Slack webhook URL, which no page shows; and deleting a standalone one
(`delete_trigger`, with view; its events go with it, whatever the events' permissions).
`change_trigger` gives nothing more on another user's trigger.

Events (the reports received) are read and deleted by the trigger's owner, and by other staff
with the events' own permissions: `view_event` (or `change_event`) to read them, their
bodies and parts, with `delete_event` to delete one. Seeing the trigger is not seeing its
reports.
"""

from enum import StrEnum

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.db.models import QuerySet
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.views import APIView

from relay.api.permissions import METHOD_ACTIONS, may_on_owned, owned_rows_for
from triggers.models import Event, Trigger
from workflows import permissions as workflows

User = AbstractBaseUser | AnonymousUser


class Action(StrEnum):
    VIEW = "view"  # the row: name, description, filters, owner, dates; never the token or Slack URL
    CHANGE = "change"  # name, description, filters, Slack webhook URL, token (regenerate)
    DELETE = "delete"


def may(user: User, action: Action, trigger: Trigger) -> bool:
    """Whether `user` may do `action` to `trigger`."""
    if not user.is_active:
        return False
    if trigger.workflow_id is not None:
        match action:
            case Action.CHANGE:
                return workflows.may(user, workflows.Action.CHANGE, trigger.workflow)
            case Action.DELETE:
                return False  # a revision of its workflow that no longer declares it does
    return may_on_owned(user, action, trigger.owner_id, Trigger)


def triggers_for(user: User, rows: QuerySet[Trigger]) -> QuerySet[Trigger]:
    """The triggers of `rows` that `user` may see (a workflow's trigger is its owner's)."""
    return owned_rows_for(user, rows)


def may_events(user: User, action: Action, trigger: Trigger) -> bool:
    """Whether `user` may view or delete the events of `trigger` (an event is never changed:
    it is a report as received)."""
    return action != Action.CHANGE and may_on_owned(user, action, trigger.owner_id, Event)


def events_for(user: User, rows: QuerySet[Event]) -> QuerySet[Event]:
    """The events of `rows` that `user` may see."""
    return owned_rows_for(user, rows, owner="trigger__owner")


class TriggerPermission(BasePermission):
    """The API's side of `may`: GET views, DELETE deletes, any other method (PATCH, PUT, POST
    to a row's action such as regenerate) changes."""

    def has_object_permission(self, request: Request, view: APIView, obj: Trigger) -> bool:
        action = Action(METHOD_ACTIONS.get(request.method or "", Action.CHANGE))
        if may(request.user, action, obj):
            return True
        if action != Action.CHANGE:
            self.message = f"You may not {action} another user's trigger."  # DRF's 403 detail
        elif obj.workflow_id is not None:
            self.message = (
                "A workflow's trigger starts runs with its owner's connections, so only the "
                "workflow's owner or a superuser may change it or regenerate its token."
            )
        else:
            self.message = (
                "A trigger's token and Slack webhook are its owner's: only its owner or a "
                "superuser may change it, its filters or its Slack webhook, or regenerate its token."
            )
        return False
