"""Who may do what through the API.

Machine endpoints: the request carries a connection's or a trigger's token.

User endpoints grant no more than the admin does: a user may do anything to what they own;
anyone else's rows need what the admin would need, staff status and the model's Django
permission (`view`, or `change`, which implies view as in the admin; `change` also to
regenerate a token; `delete`). Superusers hold every permission. Where a row is a credential
that runs as its owner, its own rule narrows this: connections (connections.permissions) and
workflows with their triggers (workflows.permissions) are changed by their owner or a
superuser only.
"""

from django.contrib.auth import get_permission_codename
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.db.models import Model, QuerySet
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.views import APIView

from relay.tokens import TokenHolder


class _HoldsToken(BasePermission):
    prefix = ""

    def has_permission(self, request: Request, view: APIView) -> bool:
        return isinstance(request.auth, TokenHolder) and request.auth.TOKEN_PREFIX == self.prefix


class IsConnection(_HoldsToken):
    """The request carries a valid connection token (see ConnectionTokenAuthentication)."""

    prefix = "rlyp"


class IsTrigger(_HoldsToken):
    """The request carries a valid push-trigger token (see TriggerTokenAuthentication)."""

    prefix = "rlyt"


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


def visible_to(user: AbstractBaseUser | AnonymousUser, rows: QuerySet) -> QuerySet:
    """The rows of `rows` that `user` may see: their own, or all with the view permission.
    (Rows they may not see are 404s, not 403s: their ids say nothing.)"""
    return rows if may_for_all(user, "view", rows.model) else rows.filter(owner=user)


class OwnerOrModelPermission(BasePermission):
    """The owner may do anything to a row; anyone else needs the admin's permission for what
    the method does. POST on a row (an action such as regenerate) is a change."""

    ACTIONS = {
        "GET": "view",
        "HEAD": "view",
        "OPTIONS": "view",
        "POST": "change",
        "PUT": "change",
        "PATCH": "change",
        "DELETE": "delete",
    }
    MESSAGE = "You may not do this to another user's {model}."

    def has_object_permission(self, request: Request, view: APIView, obj: Model) -> bool:
        if obj.owner_id == request.user.pk:  # type: ignore[attr-defined]
            return True
        self.message = self.MESSAGE.format(model=obj._meta.verbose_name)  # DRF's 403 detail
        return may_for_all(request.user, self.ACTIONS.get(request.method or "", "change"), type(obj))
