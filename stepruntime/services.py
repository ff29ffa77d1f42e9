"""What the step runtime API answers, computed for one running step (the views authenticate
and shape the bodies). Everything is evaluated as the engine evaluates a step's spec
(workflows.engine.resolve): parameters, outputs and statuses of the step's own run, and the
secrets and connections its spec, env or `when` refer to, read when they are reached.

A step reaches only what its own spec and env yield: a query (`GET /spec?q=…`) runs over the
evaluated spec, not over the run's data, and what the spec yields (a parameter bound from a
webhook's body, an output, a secret) is data, never evaluated again.
"""

import base64
from collections.abc import Callable
from datetime import datetime
from typing import Any

from stepruntime import jsonpath
from workflows import engine
from workflows.dialect.errors import EvaluationError
from workflows.dialect.evaluate import Data, WorkflowEvaluator, evaluate
from workflows.dialect.expr import ExpressionError, Options, evaluate_query, parse_template
from workflows.dialect.model import DEFAULT_EVALUATOR, Context, Result, Unresolvable, evaluate_all
from workflows.dialect.values import format_time, type_name
from workflows.dialect.workflow import Step as StepSpec
from workflows.models import StepRun, Workflow, WorkflowRun

LANGUAGES = ("", "path", "path-template", "jsonpath-template", "jsonpath")


class UnsupportedLanguage(Exception):
    pass


def step_spec(step: StepRun) -> StepSpec:
    return engine.parsed(step.run.revision_id).step(step.name)


def _container_field(step: StepRun, name: str) -> dict[str, Any]:
    container = step_spec(step).container
    return dict(getattr(container, name)) if container is not None else {}


def _query(value: Any, q: str, lang: str) -> Result:
    """`q` in `lang` over `value`, a settled spec or env (Evaluator.settle): the query reads
    what the step's own spec yields and nothing else (no name of the template environment;
    a string it selects or writes is text, never evaluated again)."""
    if lang in ("", "path"):
        # relay-core's pathlang expression, as relay_sdk sends it: `a["b"]`.
        return evaluate_query(Context(), value, q)
    if lang == "path-template":
        try:
            template = parse_template(q, Options())
        except ExpressionError as exc:
            raise EvaluationError(f"parsing error: {q}: {exc}") from None
        ctx = Context()
        unresolvable = Unresolvable()
        result = evaluate_all(ctx, DEFAULT_EVALUATOR, template.evaluate(ctx, value, unresolvable))
        result.unresolvable.extend(unresolvable)
        return result
    if lang == "jsonpath-template":
        return jsonpath.evaluate_template(value, q)
    return jsonpath.evaluate_path(value, q)


def evaluated(run: WorkflowRun, tree: Any, q: str = "", lang: str = "") -> Result:
    """`tree` (a spec or env) evaluated, or the value `q` selects from it in `lang`. Raises
    UnsupportedLanguage, and EvaluationError (a query that cannot be read included)."""
    if lang not in LANGUAGES:
        raise UnsupportedLanguage(lang)
    evaluation: Callable[[Data], Result]
    if q:

        def evaluation(data: Data) -> Result:
            # The spec evaluated once with the engine's rules, then queried as plain data:
            # what the query selects needs (and engine.resolve reads) only what it references.
            return _query(WorkflowEvaluator(data).settle(Context(), tree), q, lang)
    else:

        def evaluation(data: Data) -> Result:
            return evaluate(tree, data)

    try:
        result, _ = engine.resolve(run, evaluation)
    except RecursionError:
        raise EvaluationError("the query nests too deeply") from None
    return result


def spec(step: StepRun, q: str = "", lang: str = "") -> Result:
    return evaluated(step.run, _container_field(step, "spec"), q, lang)


def environment(step: StepRun) -> Result:
    return evaluated(step.run, _container_field(step, "env"))


def environment_variable(step: StepRun, name: str) -> Result | None:
    env = _container_field(step, "env")
    if name not in env:
        return None
    return evaluated(step.run, env[name])


def secret(step: StepRun, name: str) -> str | None:
    """The secret's value if the step's spec or env refers to it (statically or computed,
    `${secrets[parameters.x]}`) and the workflow has it; None otherwise, whichever it is."""
    trees = {"spec": _container_field(step, "spec"), "env": _container_field(step, "env")}
    _, data = engine.resolve(step.run, lambda data: evaluate(trees, data))
    return data.secrets.get(name)


def conditions(step: StepRun) -> dict[str, Any]:
    """relay-core's GET /conditions: the step's `when`, evaluated now. Raises
    EvaluationError, and ConditionTypeError for a condition that is not a boolean."""
    when = step_spec(step).when
    if when is None:
        return {"resolved": True, "success": True, "message": ""}
    result, _ = engine.resolve(step.run, lambda data: evaluate(when, data))
    values = result.value if isinstance(result.value, list) else [result.value]
    failed = False
    for value in values:
        if not isinstance(value, bool):
            if result.complete:
                raise ConditionTypeError(value)
            continue
        if not value:
            failed = True
            break
    if failed:
        return {"resolved": True, "success": False, "message": "one or more conditions failed"}
    if not result.complete:
        return {
            "resolved": False,
            "success": False,
            "message": "We could not fully evaluate this resource expression: "
            + engine.describe(result.unresolvable),
        }
    return {"resolved": True, "success": True, "message": "all checks passed"}


class ConditionTypeError(Exception):
    def __init__(self, value: Any) -> None:
        super().__init__(
            "A condition must evaluate to a single boolean value or a list of boolean values, "
            f"but your condition provided a {type_name(value)}."
        )


def jsonable(value: Any) -> Any:
    """A value as relay-core's JSON has it: times as RFC 3339, bytes as text, or
    `{"$encoding": "base64", "data": …}` when they are not UTF-8."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime):
        return format_time(value)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return {"$encoding": "base64", "data": base64.b64encode(value).decode()}
    return value


def envelope(result: Result) -> dict[str, Any]:
    """relay-core's `{"value", "unresolvable", "complete"}`."""
    return {
        "value": jsonable(result.value),
        "unresolvable": result.unresolvable.as_dict(),
        "complete": result.complete,
    }


def start_workflow(step: StepRun, name: str, parameters: dict[str, Any]) -> tuple[WorkflowRun, int]:
    """A run of the step's workflow owner's workflow `name` (relay_sdk's `workflows.run`),
    and its number among that workflow's runs, one deeper than the step's run. Raises
    Workflow.DoesNotExist, engine.ParameterError, and OverBudget (RUN_MAX_DEPTH,
    RUN_MAX_IN_PROGRESS)."""
    owner = step.run.workflow.owner
    workflow = Workflow.objects.get(owner=owner, name=name)
    run = engine.create_run(workflow, parameters, created_by=owner, parent_step=step)
    number = WorkflowRun.objects.filter(workflow=workflow, created_at__lte=run.created_at).count()
    return run, number
