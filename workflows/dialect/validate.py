"""Validating a workflow document and building the Workflow the engine runs.

First relay-core's own checks: its JSON Schema (schemas/Workflow.json, copied from
relay-core at cdb56ed33218) on the data with the tags dropped, as relay-core's ValidateYAML
does, and its decoder's (a step is a container or an approval). Then the checks relay-core
left to its API, which every published workflow passes and which a run would otherwise fail
on, or wait for ever on: unique step and trigger names, known `dependsOn` names, no cycles,
known steps and parameters in references, tags only where they are evaluated, expressions
that parse, and no expression that can only fail (evaluated with no data: an unknown name, a
constant type error).

Two checks are warnings, because relay-core accepts the document and published workflows
trip them: a function this service does not have, or a known one called with arguments it
cannot take (relay-core makes both an unresolvable invocation, so the step's spec is never
complete: `terraform-continuous-deployment` calls `!Fn.merge` with a plain map); and a
binding of a parameter the workflow does not declare (relay-core adds it to the run's
parameters, where no step here may refer to it: `datadog-to-slack` binds `eventDate`), which
is left out of the trigger's binding.
"""

import gc
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from copy import deepcopy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema_rs
from django.conf import settings
from jsonschema import Draft7Validator, FormatChecker, ValidationError

from workflows.dialect import cron, expr, imageref
from workflows.dialect.budget import Budget, exceeded
from workflows.dialect.errors import ArgumentError, EvaluationError, ExpressionError, PathError
from workflows.dialect.evaluate import TEMPLATE_NAMES, Data, WorkflowEvaluator
from workflows.dialect.fnlib import LIBRARY
from workflows.dialect.model import DEFAULT_EVALUATOR, Context
from workflows.dialect.problems import DocumentError, Problem, child_pointer, pointer_part
from workflows.dialect.workflow import Container, Parameter, References, Step, Trigger, Workflow, frozen_map
from workflows.dialect.yamlload import Document, load

SCHEMA = json.loads((Path(__file__).parent / "schemas" / "Workflow.json").read_text())
_formats = FormatChecker(formats=())


@_formats.checks("uri")
def _is_uri(value: object) -> bool:
    # gojsonschema's check: url.Parse succeeds with a scheme, and no backslash.
    if not isinstance(value, str):
        return True
    try:
        return bool(urlsplit(value).scheme) and "\\" not in value
    except ValueError:
        return False


VALIDATOR = Draft7Validator(SCHEMA, format_checker=_formats)
# The same schema and format check in Rust (about fifty times faster): it answers whether a
# document passes, and only a document it refuses is walked by VALIDATOR for the errors'
# wording. What it cannot take (NaN, a lone surrogate) also goes to VALIDATOR.
FAST_VALIDATOR = jsonschema_rs.Draft7Validator(SCHEMA, formats={"uri": _is_uri}, validate_formats=True)
FUNCTION_NAMES = ", ".join(sorted(LIBRARY))


@dataclass(frozen=True)
class Validation:
    workflow: Workflow | None
    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.problems


def validate(text: str, *, stored: bool = False) -> Validation:
    """The workflow, or the problems that make the document invalid (with their places).
    `stored`: a revision saved before (the engine reads those), whose budgets (schedule
    triggers per workflow) are not checked again, so that lowering one stops no run."""
    with _without_cycle_collection():
        return _validate(text, stored=stored)


def _validate(text: str, *, stored: bool) -> Validation:
    # (A function of its own, so that what it made and drops is freed before the collector
    # resumes: otherwise its first run would walk all of it.)
    try:
        document = load(text)
    except DocumentError as exc:
        return Validation(None, exc.problems)
    problems = schema_problems(document)
    if problems:
        return Validation(None, problems)
    return _Checker(document, budgets=not stored).run()


_collection_lock = threading.Lock()
_collection_paused = 0  # validations under way that paused it
_collection_was_enabled = False


@contextmanager
def _without_cycle_collection() -> Iterator[None]:
    """Python's cycle collector paused while a document is validated. A 1 MiB document
    becomes some 300,000 objects that all stay alive until the end, and the collector walks
    every live object of the process again and again as they are made: that was half of the
    time. Nothing is left uncollected: what validation drops is freed by reference counts,
    and the few cycles it may leave are collected as soon as the collector runs again. The
    work itself is bounded (the document's size, the expression budgets). The pause is for
    the whole process, so it is counted: the last validation to end resumes it."""
    global _collection_paused, _collection_was_enabled
    with _collection_lock:
        if _collection_paused == 0:
            _collection_was_enabled = gc.isenabled()
            gc.disable()
        _collection_paused += 1
    try:
        yield
    finally:
        with _collection_lock:
            _collection_paused -= 1
            if _collection_paused == 0 and _collection_was_enabled:
                gc.enable()


def parse(text: str, *, stored: bool = False) -> Workflow:
    """The workflow of a valid document; DocumentError otherwise (`stored`: as validate's)."""
    result = validate(text, stored=stored)
    if result.workflow is None:
        raise DocumentError(result.problems)
    return result.workflow


# JSON Schema --------------------------------------------------------------------------------

_TYPE_WORDS = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "number": "a number",
    "integer": "a whole number",
    "boolean": "true or false",
    "null": "null",
}


def _kind_of(value: Any) -> str:
    match value:
        case None:
            return "null"
        case bool():
            return "true or false"
        case int() | float():
            return "a number"
        case str():
            return "a string"
        case list():
            return "a list"
        case dict():
            return "a mapping"
    return "something else"


def _pointer(path: Iterator[Any] | Any) -> str:
    return "#" + "".join("/" + pointer_part(p) for p in path)


def schema_problems(document: Document) -> list[Problem]:
    if _passes_fast(document.raw):
        return []
    problems: list[Problem] = []
    for error in sorted(VALIDATOR.iter_errors(document.raw), key=lambda e: [str(p) for p in e.absolute_path]):
        for pointer, detail in _describe(error):
            problems.append(document.problem(pointer, detail))
    return list(dict.fromkeys(problems))


def _passes_fast(raw: Any) -> bool:
    try:
        return FAST_VALIDATOR.is_valid(raw)
    except Exception:  # a value Rust's JSON cannot hold (a lone surrogate): VALIDATOR judges it
        return False


def _describe(error: ValidationError) -> list[tuple[str, str]]:
    pointer = _pointer(error.absolute_path)
    path = list(error.absolute_path)
    where = _human_path(path)
    instance = error.instance
    if error.validator == "oneOf":
        return _describe_one_of(error, pointer, instance)
    if error.validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        return [(pointer, f"'{missing}' is required here.")]
    if error.validator == "type":
        wanted = error.validator_value
        words = " or ".join(_TYPE_WORDS.get(w, w) for w in (wanted if isinstance(wanted, list) else [wanted]))
        if not path:
            return [
                (
                    pointer,
                    "A workflow is a mapping (apiVersion, parameters, steps, triggers), "
                    f"not {_kind_of(instance)}.",
                )
            ]
        return [(pointer, f"{where} must be {words}, not {_kind_of(instance)}.")]
    if error.validator == "minLength":
        return [(pointer, f"{where} must not be empty.")]
    if error.validator in ("enum", "const"):
        allowed = error.validator_value if error.validator == "enum" else [error.validator_value]
        return [(pointer, f"{where} must be {' or '.join(repr(a) for a in allowed)}, not {instance!r}.")]
    if error.validator == "format":
        return [(pointer, f"{where} must be a URL with a scheme, such as https://example.com/.")]
    return [(pointer, error.message)]


def _human_path(path: list[Any]) -> str:
    """steps[0].dependsOn, as an author would point at it."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "The document"


def _describe_one_of(error: ValidationError, pointer: str, instance: Any) -> list[tuple[str, str]]:
    definitions = SCHEMA["definitions"]
    if not isinstance(instance, (dict, str, list)):
        return []  # the "type" error of the same value says it
    if (
        isinstance(instance, (str, list))
        and error.schema is not definitions["Step"]["properties"]["dependsOn"]
    ):
        return []
    if error.schema is definitions["Step"]:
        kind = instance.get("type", "container") if isinstance(instance, dict) else None
        if kind not in ("container", "approval"):
            return [(pointer, f"A step's type is 'container' (the default) or 'approval', not {kind!r}.")]
        branch = 1 if kind == "approval" else 0
    elif error.schema is definitions["TriggerSource"]:
        kinds = ["schedule", "push", "webhook"]
        kind = instance.get("type") if isinstance(instance, dict) else None
        if kind not in kinds:
            return [(pointer, f"A trigger's source type is 'push', 'schedule' or 'webhook', not {kind!r}.")]
        branch = kinds.index(kind)
    else:
        return [(pointer, "dependsOn is a step name or a list of step names.")]
    out: list[tuple[str, str]] = []
    for sub in error.context or []:
        if sub.schema_path and sub.schema_path[0] == branch:
            if sub.validator == "required" and "'image'" in sub.message:
                out.append((pointer, "A container step (or webhook trigger) needs an 'image'."))
            else:
                out.extend(_describe(sub))
    return out or [(pointer, error.message)]


# The other checks -----------------------------------------------------------------------------

# Where relay-core evaluates tags and ${…}; elsewhere they would be plain text.
_STEP_EXPRESSIONS = ("spec", "env", "when")
_TRIGGER_EXPRESSIONS = ("when", "binding")


class _Checker:
    def __init__(self, document: Document, budgets: bool = True) -> None:
        self.document = document
        self.budgets = budgets
        self.raw: dict[str, Any] = document.raw
        self.tree: dict[str, Any] = document.tree
        self.problems: list[Problem] = []
        self.warnings: list[Problem] = []
        self.step_names: set[str] = {s["name"] for s in self.tree.get("steps") or []}
        self.approvals = {s["name"] for s in self.tree.get("steps") or [] if s.get("type") == "approval"}
        self.parameter_names = set(self.tree.get("parameters") or {})
        # One evaluator each for steps and triggers: they parse each template once.
        self.evaluators = {
            False: WorkflowEvaluator(Data()),
            True: WorkflowEvaluator(Data(event_available=True)),
        }
        # What every dry run of the document spends, together, and what each text found.
        self.budget = Budget.for_validation()
        self.dry_runs: dict[tuple[bool, str], tuple[str, str] | None] = {}
        # Each template's expressions with their calls and data paths, found once per text.
        self.template_nodes: dict[tuple[bool, str], list[tuple[expr.Expression, list[expr.Node]]]] = {}
        self.references: dict[str, set[Any]] = {
            "parameters": set(),
            "secrets": set(),
            "connections": set(),
            "outputs": set(),
        }

    def error(self, pointer: str, detail: str) -> None:
        self.problems.append(self.document.problem(pointer, detail))

    def warn(self, pointer: str, detail: str) -> None:
        self.warnings.append(self.document.problem(pointer, detail))

    def run(self) -> Validation:
        self.check_tag_places()
        steps = [self.check_step(index, step) for index, step in enumerate(self.tree.get("steps") or [])]
        triggers = [
            self.check_trigger(index, trigger)
            for index, trigger in enumerate(self.tree.get("triggers") or [])
        ]
        self.check_unique("steps", "step")
        self.check_unique("triggers", "trigger")
        if self.budgets:
            self.check_schedule_count(triggers)
            # New documents only, as the budgets: a revision saved before still reads.
            self.check_step_names_fit_urls()
        self.check_cycles(steps)
        if self.problems:
            return Validation(None, self.problems, self.warnings)
        parameters = {
            name: Parameter(
                name=name,
                description=(spec or {}).get("description", ""),
                has_default="default" in (spec or {}),
                default=deepcopy((spec or {}).get("default")),
            )
            for name, spec in (self.raw.get("parameters") or {}).items()
        }
        references = References(**{kind: frozenset(names) for kind, names in self.references.items()})
        workflow = Workflow(
            api_version=self.raw.get("apiVersion", "v1"),
            summary=self.raw.get("summary", ""),
            description=self.raw.get("description", ""),
            parameters=frozen_map(parameters),
            steps=tuple(steps),
            triggers=tuple(triggers),
            references=references,
        )
        return Validation(workflow, [], self.warnings)

    def check_tag_places(self) -> None:
        for pointer, tag in self.document.tags.items():
            if tag.startswith("!!"):
                continue
            parts = pointer.split("/")
            allowed = (
                (len(parts) > 3 and parts[1] == "steps" and parts[3] in _STEP_EXPRESSIONS)
                or (len(parts) > 3 and parts[1] == "triggers" and parts[3] in _TRIGGER_EXPRESSIONS)
                or (
                    len(parts) > 4
                    and parts[1] == "triggers"
                    and parts[3] == "source"
                    and parts[4] in ("spec", "env")
                )
                or (len(parts) > 1 and parts[1] == "locals")
            )
            if not allowed:
                self.error(
                    pointer,
                    f"{tag} is evaluated only in a step's spec, env and when, "
                    "and a trigger's when and binding; "
                    "here it would be read as plain text.",
                )

    def check_step_names_fit_urls(self) -> None:
        """A step's name is a segment of its URLs (the API's …/steps/<name>/log, the run
        page's links), which Django's `str` converter takes without '/': such a name made
        pages that could not link to the step fail."""
        for index, step in enumerate(self.tree.get("steps") or []):
            if "/" in step["name"]:
                self.error(
                    child_pointer(f"#/steps/{index}", "name"),
                    "A step's name is part of its URLs (…/steps/<name>/log): it cannot hold '/'.",
                )

    def check_unique(self, key: str, word: str) -> None:
        seen: dict[str, int] = {}
        for index, item in enumerate(self.tree.get(key) or []):
            name = item["name"]
            if name in seen:
                self.error(
                    child_pointer(f"#/{key}/{index}", "name"),
                    f"Another {word} is already named {name!r} ({key}[{seen[name]}]); "
                    f"{word} names must be unique.",
                )
            else:
                seen[name] = index

    def check_step(self, index: int, raw_step: dict[str, Any]) -> Step:
        pointer = f"#/steps/{index}"
        name = raw_step["name"]
        depends_on = raw_step.get("dependsOn") or []
        depends_on = [depends_on] if isinstance(depends_on, str) else list(depends_on)
        for position, dependency in enumerate(depends_on):
            where = child_pointer(pointer, "dependsOn")
            if isinstance(raw_step.get("dependsOn"), list):
                where = child_pointer(where, position)
            if dependency == name:
                self.error(where, f"The step {name!r} cannot depend on itself.")
            elif dependency not in self.step_names:
                self.error(where, f"dependsOn names {dependency!r}, which is not a step of this workflow.")
        for key in ("spec", "env"):
            if key in raw_step and not isinstance(self.document.raw["steps"][index][key], dict):
                self.error(child_pointer(pointer, key), f"{key} must be a mapping of names to values.")
        found = _Found()
        for key in _STEP_EXPRESSIONS:
            if key in raw_step:
                self.check_expressions(raw_step[key], child_pointer(pointer, key), found, in_trigger=False)
        for source, where in found.outputs:
            if source == name:
                self.error(where, f"A step cannot use its own outputs ({source!r}).")
        container = None
        kind = "approval" if raw_step.get("type") == "approval" else "container"
        if kind == "container":
            self.check_image(raw_step, pointer)
            container = _container(raw_step)
        return Step(
            name=name,
            kind=kind,
            pointer=pointer,
            container=container,
            description=raw_step.get("description", "")
            if isinstance(raw_step.get("description"), str)
            else "",
            depends_on=tuple(dict.fromkeys(depends_on)),
            implicit_depends_on=tuple(
                dict.fromkeys(s for s, _ in found.outputs if s != name and s not in depends_on)
            ),
            status_of=tuple(dict.fromkeys(s for s, _ in found.statuses if s != name)),
            when=deepcopy(raw_step.get("when")),
        )

    def check_trigger(self, index: int, raw_trigger: dict[str, Any]) -> Trigger:
        pointer = f"#/triggers/{index}"
        source = raw_trigger["source"]
        binding = raw_trigger.get("binding") or {}
        found = _Found()
        bound: dict[str, Any] = {}
        for name, value in (binding.get("parameters") or {}).items():
            if name in self.parameter_names:
                bound[name] = value
            else:
                # relay-core runs it with the extra parameter, which no step may name here
                # (a reference to an undeclared parameter is an error): so it is dropped.
                self.warn(
                    child_pointer(child_pointer(child_pointer(pointer, "binding"), "parameters"), name),
                    f"The binding sets {name!r}, which is not a parameter of this workflow, "
                    "so no step can read it and it is left out; declare it under parameters "
                    "to use it.",
                )
        for key in _TRIGGER_EXPRESSIONS:
            if key in raw_trigger:
                self.check_expressions(raw_trigger[key], child_pointer(pointer, key), found, in_trigger=True)
        for key in ("spec", "env"):
            if key in source:
                where = child_pointer(child_pointer(pointer, "source"), key)
                self.check_expressions(source[key], where, found, in_trigger=True)
        kind = source["type"]
        if kind == "webhook":
            self.check_image(source, child_pointer(pointer, "source"))
        if kind == "schedule":
            try:
                cron.parse(source["schedule"])
            except cron.InvalidSchedule as exc:
                self.error(child_pointer(child_pointer(pointer, "source"), "schedule"), str(exc))
        return Trigger(
            name=raw_trigger["name"],
            kind=kind,
            pointer=pointer,
            schedule=source.get("schedule", "") if kind == "schedule" else "",
            container=_container(source) if kind == "webhook" else None,
            binding_parameters=frozen_map(deepcopy(bound)),
            binding_key=deepcopy(binding.get("key")),
            when=deepcopy(raw_trigger.get("when")),
        )

    def check_schedule_count(self, triggers: list[Trigger]) -> None:
        """At most SCHEDULES_PER_WORKFLOW schedule triggers (each starts runs on its own):
        the first one past it is the error."""
        most = settings.SCHEDULES_PER_WORKFLOW
        schedules = [trigger for trigger in triggers if trigger.kind == "schedule"]
        if len(schedules) > most:
            self.error(
                schedules[most].pointer,
                f"A workflow has at most {most} schedule triggers (SCHEDULES_PER_WORKFLOW); "
                f"this one is number {most + 1} of {len(schedules)}.",
            )

    def check_image(self, raw: dict[str, Any], pointer: str) -> None:
        # The container runtime's command line takes it (scriptsteps/container.py): a
        # reference or nothing, never text that could read as an option.
        image = raw.get("image")
        if isinstance(image, str):
            problem = imageref.problem_with(image)
            if problem:
                self.error(child_pointer(pointer, "image"), problem)

    def check_cycles(self, steps: list[Step]) -> None:
        after = {step.name: step.after for step in steps}
        pointers = {step.name: step.pointer for step in steps}
        state: dict[str, int] = {}  # 1: on the path, 2: done
        reported: set[frozenset[str]] = set()
        # The problems, made after the walk: `visit` refers to itself, a cycle that only the
        # cycle collector frees, which must not hold this checker (and all it parsed).
        found: list[tuple[str, str]] = []

        def visit(name: str, path: list[str]) -> None:
            state[name] = 1
            path.append(name)
            for before in after.get(name, ()):
                if before not in after or before == name:
                    continue  # unknown names and self-dependencies are reported already
                if state.get(before) == 1:
                    cycle = path[path.index(before) :]
                    if frozenset(cycle) not in reported:
                        reported.add(frozenset(cycle))
                        shown = " → ".join([*reversed(cycle), cycle[-1]])
                        found.append(
                            (
                                pointers[before],
                                f"The steps wait for each other in a cycle: {shown} "
                                "(through dependsOn and references to outputs or statuses).",
                            )
                        )
                elif before not in state:
                    visit(before, path)
            path.pop()
            state[name] = 2

        for step in steps:
            if step.name not in state:
                visit(step.name, [])
        for pointer, detail in found:
            self.error(pointer, detail)

    # Expressions ------------------------------------------------------------------------------

    def check_expressions(self, raw: Any, pointer: str, found: "_Found", *, in_trigger: bool) -> None:
        """Check every value in an expression position: its tags and templates, each then
        evaluated once with no data (a dry run) to find what can only fail."""
        self._walk(self._tree_at(pointer), pointer, found, in_trigger)

    def _dry_run(self, tree: Any, pointer: str, in_trigger: bool) -> None:
        """Evaluate a value that reads no data: if that fails, every run fails. (A value that
        reads data is not judged: the data may decide which parts are evaluated.)"""
        if not self._constant(tree, in_trigger):
            return
        if isinstance(tree, str):
            # A document repeats its expressions: each text is evaluated once.
            key = (in_trigger, tree)
            if key not in self.dry_runs:
                self.dry_runs[key] = self._dry_run_problem(tree, "", in_trigger)
            found = self.dry_runs[key]
        else:
            found = self._dry_run_problem(tree, "", in_trigger)
        if found is not None:
            self.error(pointer + found[0], found[1])

    def _dry_run_problem(self, tree: Any, pointer: str, in_trigger: bool) -> tuple[str, str] | None:
        """(the pointer under `tree`, the problem), or None when the evaluation works."""
        try:
            self.evaluators[in_trigger].evaluate(Context(budget=self.budget), tree, -1)
        except EvaluationError as exc:
            # (Read in a function of its own: a local of this frame holding the error would
            # hold, through its traceback, every frame and value of the failed evaluation.)
            return _dry_run_failure(exc, pointer)
        except RecursionError:
            return pointer, "This expression nests too deeply."
        return None

    def _constant(self, tree: Any, in_trigger: bool) -> bool:
        if isinstance(tree, str):
            if "$" not in tree:
                return True
            # A path in a pipe's right side reads the pipe's input, not the data.
            return not any(
                isinstance(n, expr.Var) for _, nodes in self._template_nodes(tree, in_trigger) for n in nodes
            )
        if isinstance(tree, list):
            return all(self._constant(item, in_trigger) for item in tree)
        if isinstance(tree, dict):
            return "$type" not in tree and all(self._constant(v, in_trigger) for v in tree.values())
        return True

    def _check_arity(self, name: str, args: list[Any] | dict[str, Any], pointer: str) -> None:
        """A known function called with arguments it cannot take is never resolved: relay-core
        accepts the document (an unresolvable invocation, like an unknown function), and the
        step fails here when it starts; a warning, as a published workflow does it."""
        descriptor = LIBRARY.get(name)
        if descriptor is None:
            return
        try:
            if isinstance(args, dict):
                descriptor.keyword(DEFAULT_EVALUATOR, dict.fromkeys(args))
            else:
                descriptor.positional(DEFAULT_EVALUATOR, [None] * len(args))
        except ArgumentError as exc:
            self.warn(
                pointer,
                f"{name}() cannot be called like this: {exc}; relay-core accepts it, but it is never "
                "resolved, so what evaluates it fails (a step's spec or env, a when, a binding).",
            )

    def _tree_at(self, pointer: str) -> Any:
        node: Any = self.tree
        for part in pointer.split("/")[1:]:
            key = part.replace("~1", "/").replace("~0", "~")
            node = node[int(key)] if isinstance(node, list) else node[key]
        return node

    def _walk(self, tree: Any, pointer: str, found: "_Found", in_trigger: bool) -> None:
        before = len(self.problems)
        if isinstance(tree, str):
            if "$" in tree:
                self._check_template(tree, pointer, found, in_trigger)
                if len(self.problems) == before:
                    self._dry_run(tree, pointer, in_trigger)
            return
        if isinstance(tree, list):
            for index, item in enumerate(tree):
                self._walk(item, child_pointer(pointer, index), found, in_trigger)
            return
        if not isinstance(tree, dict):
            return
        if "$type" in tree:
            self._check_reference(tree, pointer, found, in_trigger)
            if len(self.problems) == before:
                self._dry_run(tree, pointer, in_trigger)
            return
        if len(tree) == 1:
            (key,) = tree
            if key.startswith("$fn."):
                self._check_function(key[len("$fn.") :], pointer)
                self._check_arity(key[len("$fn.") :], _invocation_arguments(tree[key]), pointer)
                self._walk(tree[key], pointer, found, in_trigger)
                if len(self.problems) == before:
                    self._dry_run(tree, pointer, in_trigger)
                return
        for key, value in tree.items():
            self._walk(value, child_pointer(pointer, key), found, in_trigger)

    def _check_function(self, name: str, pointer: str) -> None:
        if name not in LIBRARY:
            self.warn(pointer, f"There is no function {name!r} here; the functions are {FUNCTION_NAMES}.")

    def _check_reference(self, tree: dict[str, Any], pointer: str, found: "_Found", in_trigger: bool) -> None:
        kind = tree["$type"]
        fields = {k: v for k, v in tree.items() if k != "$type"}
        for value in fields.values():
            if not isinstance(value, str):
                self._walk(value, pointer, found, in_trigger)
        name = fields.get("name")
        if kind == "Data":
            if not in_trigger:
                self.error(
                    pointer,
                    "!Data reads the event that triggered the run: use it in a trigger's when or binding.",
                )
            return
        if kind in ("Output", "Status", "Answer") and in_trigger:
            self.error(pointer, f"!{kind} refers to a step, and a trigger runs before any step.")
            return
        if kind == "Parameter":
            self._parameter(name, pointer, in_trigger, "!Parameter")
        elif kind == "Secret" and isinstance(name, str):
            self.references["secrets"].add(name)
        elif kind == "Connection" and isinstance(fields.get("type"), str) and isinstance(name, str):
            self.references["connections"].add((fields["type"], name))
        elif kind == "Output":
            self._output(fields.get("from"), name, pointer, found)
        elif kind == "Status":
            if isinstance(name, str):
                self._step(name, pointer, "!Status")
                found.statuses.append((name, pointer))
        elif kind == "Answer":
            ask = fields.get("askRef")
            if isinstance(ask, str):
                if ask not in self.approvals:
                    self.error(
                        pointer, f"!Answer names {ask!r}, which is not an approval step of this workflow."
                    )
                found.statuses.append((ask, pointer))

    def _parameter(self, name: Any, pointer: str, in_trigger: bool, spelling: str) -> None:
        if in_trigger:
            self.error(
                pointer,
                f"{spelling} is not available in a trigger; a trigger sees the event (!Data, ${{event}}).",
            )
        elif isinstance(name, str):
            if name not in self.parameter_names:
                self.error(pointer, f"{spelling} names {name!r}, which is not declared under parameters.")
            self.references["parameters"].add(name)

    def _step(self, name: str, pointer: str, spelling: str) -> bool:
        if name not in self.step_names:
            self.error(pointer, f"{spelling} names the step {name!r}, which is not a step of this workflow.")
            return False
        return True

    def _output(self, source: Any, name: Any, pointer: str, found: "_Found") -> None:
        if not isinstance(source, str):
            return
        if self._step(source, pointer, "The output reference"):
            found.outputs.append((source, pointer))
            if isinstance(name, str):
                self.references["outputs"].add((source, name))

    def _check_template(self, text: str, pointer: str, found: "_Found", in_trigger: bool) -> None:
        try:
            expressions = self._template_nodes(text, in_trigger)
        except ExpressionError as exc:
            self.error(pointer, f"The expression cannot be read: {exc}.")
            return
        except RecursionError:
            self.error(pointer, "The expression nests too deeply.")
            return
        for expression, nodes in expressions:
            for node in nodes:
                if isinstance(node, expr.Call):
                    self._check_function(node.name, pointer)
                    self._check_arity(node.name, node.args, pointer)
                    continue
                assert isinstance(node, expr.Var)
                self._template_reference(node, expression.source, pointer, found, in_trigger)

    def _template_nodes(self, text: str, in_trigger: bool) -> list[tuple[expr.Expression, list[expr.Node]]]:
        """The template's expressions, each with its calls and the paths that read data
        (_environment_nodes), worked out once per text: a document repeats its strings, and
        each is checked, then judged constant or not. Raises ExpressionError."""
        key = (in_trigger, text)
        if key not in self.template_nodes:
            template = self.evaluators[in_trigger].template(text)
            self.template_nodes[key] = [(e, _environment_nodes(e.node)) for e in template.expressions]
        return self.template_nodes[key]

    def _template_reference(
        self, node: expr.Var, source: str, pointer: str, found: "_Found", in_trigger: bool
    ) -> None:
        keys = [k.value if isinstance(k, expr.Const) else None for k in node.keys]
        if not keys or not isinstance(keys[0], str):
            return  # `$` alone, or a computed first name
        root = keys[0]
        if root not in TEMPLATE_NAMES:
            where = "in a trigger" if in_trigger else "in a step"
            names = ", ".join(n for n in TEMPLATE_NAMES if in_trigger or n != "event")
            self.error(pointer, f"{source}: {root!r} is not a name {where}; the names are {names}.")
            return
        if root == "event" and not in_trigger:
            self.error(pointer, f"{source}: event data exists only in a trigger's when and binding.")
            return
        if root in ("outputs", "parameters") and in_trigger:
            self.error(pointer, f"{source}: {root} are not available in a trigger; a trigger sees the event.")
            return
        name = keys[1] if len(keys) > 1 else None
        if isinstance(name, float):
            name = expr.string_key(name)
        if not isinstance(name, str):
            return
        if root == "parameters":
            self._parameter(name, pointer, in_trigger, source)
        elif root == "secrets":
            self.references["secrets"].add(name)
        elif root == "connections" and len(keys) > 2 and isinstance(keys[2], str):
            self.references["connections"].add((name, keys[2]))
        elif root == "outputs":
            output = keys[2] if len(keys) > 2 and isinstance(keys[2], str) else None
            self._output(name, output, pointer, found)


@dataclass
class _Found:
    outputs: list[tuple[str, str]] = field(default_factory=list)  # (step, pointer)
    statuses: list[tuple[str, str]] = field(default_factory=list)


def _dry_run_failure(exc: EvaluationError, pointer: str) -> tuple[str, str]:
    """(the pointer under the evaluated tree, the problem) of a failed dry run."""
    over = exceeded(exc)
    if over is not None:
        return pointer, f"This expression is over the evaluation budget: {over}."
    # The evaluator names the path under `tree` where it failed.
    error: BaseException = exc
    while isinstance(error, PathError):
        pointer = child_pointer(pointer, error.path)
        error = error.cause
    return pointer, f"This expression fails whatever the data: {error}."


def _invocation_arguments(value: Any) -> list[Any] | dict[str, Any]:
    """How relay-core passes a `$fn.` map's value: a list positionally, a plain map by
    keyword, anything else (a reference, a template, a scalar) as the one argument."""
    if isinstance(value, list):
        return value
    if isinstance(value, dict) and "$type" not in value and "$encoding" not in value:
        if not (len(value) == 1 and next(iter(value)).startswith("$fn.")):
            return value
    return [value]


def _environment_nodes(node: expr.Node) -> list[expr.Node]:
    """Function calls, and paths that start at the template's data (not a pipe's input).
    (A loop, not nested generators, which are quadratic in the depth of the tree.)"""
    found: list[expr.Node] = []
    pending: list[tuple[expr.Node, bool]] = [(node, True)]  # (node, whether to look under it)
    while pending:
        current, under = pending.pop()
        if isinstance(current, (expr.Var, expr.Call)):
            found.append(current)
        if not under:
            continue
        if isinstance(current, expr.Pipe):
            # The right side reads the pipe's input: only its calls matter here, after the
            # left side's nodes.
            calls: list[tuple[expr.Node, bool]] = []
            under_right = [current.right]  # (expr.walk's order, without its generator)
            while under_right:
                inner = under_right.pop()
                if isinstance(inner, expr.Call):
                    calls.append((inner, False))
                nodes = list(inner.children())
                nodes.reverse()
                under_right += nodes
            calls.reverse()
            pending += calls
            pending.append((current.left, True))
            continue
        children = [(child, True) for child in current.children()]
        children.reverse()
        pending += children
    return found


def _container(raw: dict[str, Any]) -> Container:
    return Container(
        image=raw.get("image", ""),
        spec=frozen_map(deepcopy(raw["spec"]) if isinstance(raw.get("spec"), dict) else {}),
        env=frozen_map(deepcopy(raw["env"]) if isinstance(raw.get("env"), dict) else {}),
        input=tuple(raw.get("input") or ()),
        input_file=raw.get("inputFile", ""),
        command=raw.get("command", ""),
        args=tuple(raw.get("args") or ()),
    )
