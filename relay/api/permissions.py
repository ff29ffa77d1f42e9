"""Who may do what through the API.

Machine endpoints: the request carries a connection's or a trigger's token.

User endpoints grant no more than the admin does: a user may do anything to what they own;
anyone else's rows need what the admin would need, staff status and the model's Django
permission (`view`, or `change`, which implies view as in the admin; `delete`). Superusers
hold every permission. Every owned row is a credential (a connection's token, a trigger's
token and Slack webhook, a workflow that runs with its owner's connections), so each has its
own rule that narrows this, one for the admin and the API alike: connections
(connections.permissions), triggers and their events (triggers.permissions), and workflows
(workflows.permissions). Each is written, and its token regenerated, by its owner or a
superuser only; other staff's permissions give view and delete (and a workflow's runs:
their view, cancel and approvals).
"""

from django.contrib.auth import get_permission_codename
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.db.models import Model, QuerySet
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.views import APIView

from relay.tokens import TokenHolder


class HoldsToken(BasePermission):
    """The request carries a valid token of `holder_model` (each app's subclass names it), as
    its HolderTokenAuthentication found it."""

    holder_model: type[TokenHolder]

    def has_permission(self, request: Request, view: APIView) -> bool:
        return isinstance(request.auth, self.holder_model)


def is_superuser(user: AbstractBaseUser | AnonymousUser) -> bool:
    # As for any other permission, the admin's rule: nothing without staff status.
    return bool(user.is_active and user.is_staff and user.is_superuser)


def may_for_all(user: AbstractBaseUser | AnonymousUser, action: str, model: type[Model]) -> bool:
    """Whether the admin would let `user` do `action` (view, change, delete) to any row of
    `model`, whoever owns it."""
    if not (user.is_active and user.is_staff):
        return False  # the admin lets no one in who is not staff, whatever their permissions
    opts = model._meta
    actions = ("view", "change") if action == "view" else (action,)
    return any(user.has_perm(f"{opts.app_label}.{get_permission_codename(a, opts)}") for a in actions)


# What an HTTP method does to a row: GET views, DELETE deletes, any other method (PATCH, PUT,
# a POST to one of its actions such as regenerate) changes it.
METHOD_ACTIONS = {"GET": "view", "HEAD": "view", "OPTIONS": "view", "DELETE": "delete"}


def may_on_owned(
    user: AbstractBaseUser | AnonymousUser, action: str, owner_id: object, model: type[Model]
) -> bool:
    """The rule of a row that holds its owner's credential (a connection, a trigger, its
    events): its owner and superusers do anything; other staff see it with the model's `view`
    (or `change`) permission and delete it with `view` and `delete`; nobody else changes it."""
    if not user.is_active:
        return False
    if owner_id == user.pk or is_superuser(user):
        return True
    if action == "view":
        return may_for_all(user, "view", model)
    if action == "delete":
        return may_for_all(user, "view", model) and may_for_all(user, "delete", model)
    return False  # change: the owner's alone


def owned_rows_for(user: AbstractBaseUser | AnonymousUser, rows: QuerySet, owner: str = "owner") -> QuerySet:
    """The rows of `rows` that `user` may see under may_on_owned (`owner`: the lookup of the
    owner's id)."""
    if not user.is_active:
        return rows.none()
    return rows if may_for_all(user, "view", rows.model) else rows.filter(**{owner: user.pk})
