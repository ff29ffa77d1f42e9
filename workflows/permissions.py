"""Who may do what to a workflow, its runs, approvals and triggers: one rule for the admin and
the API alike (workflows.admin, workflows.api.views; triggers.permissions asks it of a
workflow's triggers for the triggers' admin and API).

A workflow runs with its owner's connections and secrets. So whatever decides what code runs
as the owner, or hands out a credential that starts runs as the owner, is the owner's alone
(and a superuser's): its document (which declares its steps and triggers), its secrets, its
triggers' filters and tokens, starting a run. Changing the owner is a superuser's alone: an
owner handing their workflow to bob would make their document run with bob's connections.

Other staff's Django permissions give what cannot run code as anyone: seeing a workflow
(`view_workflow`, or `change_workflow`, which implies view as everywhere in the admin) and
deleting it (`delete_workflow`, with view); seeing its runs and approvals (`view_workflowrun`,
or `change_workflowrun`), cancelling runs (`change_workflowrun`) and deleting complete ones
(`delete_workflowrun`, with view); answering approvals
(`approve_steprun`, with the view of runs). `change_workflow`, `add_workflowrun` and the
triggers' `change_trigger` give nothing more on another user's workflow.

Answering an approval needs `approve_steprun` for the owner too: approving is a decision of its
own, apart from writing the workflow (docs/api.md, "API").
"""

from enum import StrEnum

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.db.models import QuerySet

from relay.api.permissions import is_superuser, may_for_all
from workflows.models import StepRun, Workflow, WorkflowRun

User = AbstractBaseUser | AnonymousUser


class Action(StrEnum):
    VIEW = "view"  # the workflow, its revisions, secrets' names and triggers
    CHANGE = "change"  # document, description, name, secrets, triggers' filters and tokens
    RUN = "run"  # start a run
    VIEW_RUNS = "view runs"  # its runs, their steps, logs and approvals
    CANCEL = "cancel"
    DELETE = "delete"
    DELETE_RUNS = "delete runs"  # a complete run, with its steps, their logs and credentials
    APPROVE = "approve"


def may(user: User, action: Action, workflow: Workflow) -> bool:
    """Whether `user` may do `action` to `workflow` (to one of its runs, for the run actions)."""
    if not user.is_active:
        return False
    if action == Action.APPROVE:
        return user.has_perm("workflows.approve_steprun") and may(user, Action.VIEW_RUNS, workflow)
    if workflow.owner_id == user.pk or is_superuser(user):
        return True
    match action:
        case Action.VIEW:
            return may_for_all(user, "view", Workflow)
        case Action.DELETE:
            return may_for_all(user, "view", Workflow) and may_for_all(user, "delete", Workflow)
        case Action.VIEW_RUNS:
            return may_for_all(user, "view", WorkflowRun)
        case Action.CANCEL:
            return may_for_all(user, "change", WorkflowRun)
        case Action.DELETE_RUNS:
            return may_for_all(user, "view", WorkflowRun) and may_for_all(user, "delete", WorkflowRun)
    return False  # CHANGE, RUN: the owner's alone


def workflows_for(user: User, rows: QuerySet[Workflow]) -> QuerySet[Workflow]:
    """The workflows of `rows` that `user` may see."""
    if not user.is_active:
        return rows.none()
    return rows if may_for_all(user, "view", Workflow) else rows.filter(owner=user.pk)


def runs_for(user: User, rows: QuerySet[WorkflowRun]) -> QuerySet[WorkflowRun]:
    """The runs of `rows` that `user` may see (and so their steps and approvals)."""
    if not user.is_active:
        return rows.none()
    return rows if may_for_all(user, "view", WorkflowRun) else rows.filter(workflow__owner=user.pk)


def steps_for(user: User, rows: QuerySet[StepRun]) -> QuerySet[StepRun]:
    """The steps of `rows` (approvals, in the admin) that `user` may see: as their runs."""
    if not user.is_active:
        return rows.none()
    return rows if may_for_all(user, "view", WorkflowRun) else rows.filter(run__workflow__owner=user.pk)
