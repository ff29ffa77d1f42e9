"""The project's imports run one way (issue 19 §4): no two of its files import each other,
directly or round a loop; no file imports a tasks module (a service queues a task by its
name: relay.dispatch); the shared base (relay/) names no app; the engine's registry imports
no step kind (each registers itself from its app's ready()). Read from the source, every
import counted, those inside functions too (a late import is still a tie)."""

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from workflows.steps import registry

ROOT = Path(__file__).resolve().parent.parent
APPS = (
    "connections",
    "puppet_connection",
    "runs",
    "inventory",
    "triggers",
    "workflows",
    "stepruntime",
    "scriptsteps",
)
PACKAGES = ("relay", *APPS)
# The project's entry points, which put the apps together (the ASGI application serves the
# runs' long-poll on the loop): above every app, not part of the shared base below them.
ENTRY_POINTS = {"relay.asgi", "relay.wsgi", "relay.urls", "relay.settings", "relay.celery"}


def module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" not in path.parts:
                found[module_of(path)] = path
    return found


def imported(path: Path, module: str, known: dict[str, Path]) -> Iterator[str]:
    """The project's modules that `path` imports (a name taken from a package: the module of
    that name when there is one, else the package)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names
            ]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                yield name


def graph() -> dict[str, set[str]]:
    known = sources()
    return {module: set(imported(path, module, known)) for module, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for after in sorted(edges.get(node, ())):
            if after not in index:
                visit(after)
                low[node] = min(low[node], low[after])
            elif after in on_stack:
                low[node] = min(low[node], index[after])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_finder_sees_a_circle_and_a_late_import():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    edges = graph()
    # late imports count: WorkflowsConfig.ready imports the kinds it registers
    assert "workflows.steps.puppet_run" in edges["workflows.apps"]
    assert "relay.dispatch" in edges["workflows.engine"]


def test_no_two_files_import_each_other_even_round_a_loop():
    assert circles(graph()) == []


def test_nothing_imports_a_tasks_module():
    edges = graph()
    assert {
        (module, name) for module, names in edges.items() for name in names if name.endswith(".tasks")
    } == set()


def test_the_shared_base_names_no_app():
    edges = graph()
    assert {
        (module, name)
        for module, names in edges.items()
        if module.split(".")[0] == "relay" and module not in ENTRY_POINTS
        for name in names
        if name.split(".")[0] in APPS
    } == set()


def test_the_engine_and_its_registry_import_no_step_kind():
    edges = graph()
    kinds = {name for name in edges if name.startswith("workflows.steps.") or name.startswith("scriptsteps.")}
    # what a kind is built on, not a kind
    kinds -= {
        "workflows.steps.base",
        "workflows.steps.registry",
        "workflows.steps.spec",
        "scriptsteps.masking",
    }
    assert edges["workflows.steps.registry"] & kinds == set()
    assert edges["workflows.engine"] & kinds == set()


def test_each_app_registers_its_step_kinds_in_a_fresh_process_whatever_is_imported_first():
    # A worker imports the tasks modules first, the web its URLs, `manage.py check` its
    # checks: every order ends with the same kinds registered and the engine importable.
    for first in (
        "workflows.tasks",
        "scriptsteps.tasks",
        "workflows.engine",
        "relay.urls",
        "scriptsteps.services",
    ):
        script = (
            "import django, importlib; django.setup(); "
            f"importlib.import_module({first!r}); "
            "import workflows.engine, workflows.tasks, scriptsteps.tasks; "
            "from workflows.steps import registry; "
            "print(' '.join(registry.runnable_images()))"
        )
        done = subprocess.run(
            [sys.executable, "-c", script],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == registry.runnable_images(), first
