"""How long validating a workflow document takes (workflows.dialect.validate, what
`POST /api/workflows/validate` and every save run), for documents just under the 1 MiB limit
and for documents made to cost as much as they can (expressions that double a value).

    .venv/bin/python bench/validate.py [--repeat 3]

Prints, for each document, its size, the median wall time and CPU time of `--repeat`
validations in this process, and what validation said. Wall time depends on the machine's
load; CPU time (this process's) much less. No database or service is needed: the budgets are
the settings' defaults (workflows/dialect/budget.py).
"""

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workflows.dialect.validate import validate  # noqa: E402

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


def measure(text: str, repeat: int) -> tuple[float, float, str]:
    walls, cpus = [], []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        result = validate(text)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    if result.valid:
        said = "valid"
    else:
        budget = sum("over the evaluation budget" in p.detail for p in result.problems)
        said = f"{len(result.problems)} problems ({budget} over the budget)"
    return statistics.median(walls), statistics.median(cpus), said


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{'document':55} {'bytes':>9} {'wall s':>7} {'cpu s':>7}  result")
    for name, text in DOCUMENTS.items():
        wall, cpu, said = measure(text, args.repeat)
        print(f"{name:55} {len(text.encode()):9,} {wall:7.3f} {cpu:7.3f}  {said}")


if __name__ == "__main__":
    main()
