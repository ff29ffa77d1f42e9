"""How long validating a workflow document takes (workflows.dialect.validate, what
`POST /api/workflows/validate` and every save run), for documents just under the 1 MiB limit
and for documents made to cost as much as they can (expressions that double a value).

    .venv/bin/python bench/validate.py [--repeat 3]

Prints, for each document, its size, the median wall time and CPU time of `--repeat`
validations in this process, the floor (the CPU time of PyYAML's C loader, `yaml.load` with
CSafeLoader, on the same text: reading it, nothing more) and the ratio of the two, and what
validation said. Wall time depends on the machine's load; CPU time (this process's) much
less, and the ratio least: compare ratios between runs made at different times. No database
or service is needed: the budgets are the settings' defaults (workflows/dialect/budget.py).
"""

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "relay.settings")
os.environ.setdefault("DEBUG", "1")  # its defaults for keys; no database or service is used

import django  # noqa: E402
import yaml  # noqa: E402

django.setup()  # the settings' defaults (SCHEDULES_PER_WORKFLOW, EXPRESSION_*)

from workflows.dialect.validate import Validation, validate  # noqa: E402

LIMIT = 1024 * 1024
NESTED = "jsonMarshal(" * 24 + "'\"'" + ")" * 24  # the issue's: each level doubles the text


def quoted(expression: str) -> str:
    return "'${" + expression.replace("'", "''") + "}'"


def filled(head: list[str], item: Callable[[int], list[str]]) -> str:
    """`head`, then items until the next would pass the 1 MiB limit."""
    lines, size, index = list(head), sum(len(line) + 1 for line in head), 0
    while True:
        more = item(index)
        grown = size + sum(len(line.encode()) + 1 for line in more)
        if grown > LIMIT:
            return "\n".join(lines) + "\n"
        lines += more
        size, index = grown, index + 1


def step(index: int, values: Callable[[int, int], str], keys: int = 10) -> list[str]:
    return [f"- name: s{index}", "  image: relaysh/core", "  spec:"] + [
        f"    k{key}: {values(index, key)}" for key in range(keys)
    ]


DOCUMENTS: dict[str, str] = {
    "the issue's 413 bytes (jsonMarshal 24 deep)": (
        f"apiVersion: v1\nsteps:\n- name: a\n  image: relaysh/core\n  spec:\n    x: {quoted(NESTED)}\n"
    ),
    "1 MiB: one step, a plain spec": filled(
        ["apiVersion: v1", "steps:", "- name: s", "  image: relaysh/core", "  spec:"],
        lambda i: [f"    k{i}: value number {i} of the spec"],
    ),
    "1 MiB: steps of data references": filled(
        ["apiVersion: v1", "parameters:", "  p: {default: 1}", "steps:"],
        lambda i: step(i, lambda s, k: "${parameters.p}"),
    ),
    "1 MiB: steps of constant expressions, repeated": filled(
        ["apiVersion: v1", "steps:"],
        lambda i: step(i, lambda s, k: f"${{concat('a', 'b', toString({k}))}}"),
    ),
    "1 MiB: steps of constant expressions, all different": filled(
        ["apiVersion: v1", "steps:"],
        lambda i: step(i, lambda s, k: f"${{concat('a', 'b', toString({s * 10 + k}))}}"),
    ),
    "1 MiB: doubling expressions, all different": filled(
        ["apiVersion: v1", "steps:"],
        lambda i: step(i, lambda s, k: quoted(NESTED.replace('"', '"' * (1 + (s * 10 + k) % 50)))),
    ),
    "1 MiB: shared lists walked, all different": filled(
        ["apiVersion: v1", "steps:"],
        lambda i: step(i, lambda s, k: quoted(f"'{s}-{k}' " + "|> [$, $] " * 40)),
    ),
}


def cpu_of(run: Callable[[], object], repeat: int) -> tuple[float, float, object]:
    """The median wall and CPU seconds of `repeat` calls, and the last call's result."""
    walls, cpus = [], []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        result = run()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus), result


def floor(text: str, repeat: int) -> float:
    """CPU seconds of PyYAML's C loader reading the same text (no validation at all): the
    floor, measured in the same minutes, so that figures compare across loads and machines."""
    return cpu_of(lambda: yaml.load(text, Loader=yaml.CSafeLoader), repeat)[1]


def measure(text: str, repeat: int) -> tuple[float, float, str]:
    wall, cpu, result = cpu_of(lambda: validate(text), repeat)
    assert isinstance(result, Validation)
    if result.valid:
        said = "valid"
    else:
        budget = sum("over the evaluation budget" in p.detail for p in result.problems)
        said = f"{len(result.problems)} problems ({budget} over the budget)"
    return wall, cpu, said


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{'document':55} {'bytes':>9} {'wall s':>7} {'cpu s':>7} {'floor s':>7} {'/floor':>6}  result")
    for name, text in DOCUMENTS.items():
        wall, cpu, said = measure(text, args.repeat)
        least = floor(text, args.repeat)
        figures = f"{wall:7.3f} {cpu:7.3f} {least:7.3f} {cpu / least:6.1f}"
        print(f"{name:55} {len(text.encode()):9,} {figures}  {said}")


if __name__ == "__main__":
    main()
