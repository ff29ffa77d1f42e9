"""The steps the engine runs itself: image name (without tag or digest, see base.image_name)
-> handler. Any other image is not run here (the engine says so)."""

from collections.abc import Callable

from workflows.steps.base import StepHandler
from workflows.steps.puppet_plan_run_start import PlanRunStart
from workflows.steps.puppet_run import PuppetRun
from workflows.steps.puppet_run_start import RunStart
from workflows.steps.puppet_run_wait import RunWait
from workflows.steps.puppet_task_run_start import TaskRunStart
from workflows.steps.slack_message_send import MessageSend

HANDLERS: dict[str, Callable[[], StepHandler]] = {
    handler.image: handler
    for handler in (RunStart, RunWait, PuppetRun, TaskRunStart, PlanRunStart, MessageSend)
}
