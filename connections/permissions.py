"""Who may do what to a connection: one rule for the admin and the API alike
(connections.admin.ConnectionAdmin, connections.api's and puppet_connection.api's viewsets).

A connection is a credential its owner's workflows use: a step naming
`${connections.slack['team']}` posts with the owner's Slack bot token, and whoever holds a
Puppet connection's token is the owner's bridge on /_puppet/runs (it takes the Puppet runs of
every workflow of theirs that names it and answers their results). So writing a connection is
its owner's alone (and a superuser's): regenerating its token (the answer shows the new one),
replacing a Slack token (their workflows then post with it), renaming it (a workflow names a
connection by name: a rename points it at another) and its description, one rule for every
write. Its owner is chosen once, when it is made (by a superuser, for someone else), and
changed by no one afterwards: moving it would hand its token to another user's workflows.

Other staff's Django permissions give what runs nothing as anyone: seeing a connection
(`view_…`, or `change_…`, which implies view as everywhere in the admin), never its credential,
which no page shows; and deleting it (`delete_…`, with view: the owner's workflows that name it
then fail, nothing runs). `change_…` gives nothing more on another user's connection.
"""

from enum import StrEnum

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.db.models import QuerySet
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.views import APIView

from connections.models import Connection
from relay.api.permissions import METHOD_ACTIONS, may_on_owned, owned_rows_for

User = AbstractBaseUser | AnonymousUser


class Action(StrEnum):
    VIEW = "view"  # the row: name, description, owner, dates; never the credential
    CHANGE = "change"  # name, description, token (regenerate, replace)
    DELETE = "delete"


def may(user: User, action: Action, connection: Connection) -> bool:
    """Whether `user` may do `action` to `connection`."""
    return may_on_owned(user, action, connection.owner_id, type(connection))


def connections_for(user: User, rows: QuerySet[Connection]) -> QuerySet[Connection]:
    """The connections of `rows` that `user` may see."""
    return owned_rows_for(user, rows)


class ConnectionPermission(BasePermission):
    """The API's side of `may`: GET views, DELETE deletes, any other method (PATCH, PUT, POST
    to a row's action such as regenerate) changes."""

    def has_object_permission(self, request: Request, view: APIView, obj: Connection) -> bool:
        action = Action(METHOD_ACTIONS.get(request.method or "", Action.CHANGE))
        if may(request.user, action, obj):
            return True
        kind = obj._meta.verbose_name
        self.message = (  # DRF's 403 detail
            f"A {kind} is its owner's credential: only its owner or a superuser may change it, "
            "rename it or set its token."
            if action == Action.CHANGE
            else f"You may not {action} another user's {kind}."
        )
        return False
