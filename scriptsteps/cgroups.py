"""Per-step cgroups (cgroup v1: `pids`, `memory`, `cpuacct`), the limits that hold for a whole
sandbox rather than for each of its processes: a fork bomb meets `pids.max`, many processes
that each stay under a per-process limit still meet `memory.limit_in_bytes`, and CPU time is
summed over every process the step ran.

A step's cgroups are `<controller>/<STEP_CGROUP_PARENT>/<name>`, made by the worker (root, or
a user the parent directories were delegated to) before the sandbox starts and removed after.
The sandbox's own launcher joins them (it writes its pid into their `tasks`, which are given
to the sandbox's uid), before bubblewrap starts, so nothing it starts is ever outside them.
On a machine without them (cgroup v2 only, or no permission) `available()` is False and the
sandbox falls back to rlimits (sandbox.py)."""

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("pids", "memory", "cpuacct")


def _parent(controller: str, parent: str) -> Path:
    return ROOT / controller / parent


def available(parent: str) -> bool:
    """Whether this process can make a step's cgroups under every controller."""
    for controller in CONTROLLERS:
        base = _parent(controller, parent)
        try:
            base.mkdir(exist_ok=True)
        except OSError:
            return False
        if not os.access(base, os.W_OK) or not (ROOT / controller / "tasks").exists():
            return False
    return True


@dataclass
class StepCgroup:
    name: str
    parent: str

    def path(self, controller: str) -> Path:
        return _parent(controller, self.parent) / self.name

    @property
    def tasks_files(self) -> list[str]:
        return [str(self.path(controller) / "tasks") for controller in CONTROLLERS]

    def create(self, processes: int, memory_bytes: int, uid: int | None, gid: int | None) -> None:
        for controller in CONTROLLERS:
            self.path(controller).mkdir(exist_ok=True)
        (self.path("pids") / "pids.max").write_text(str(processes))
        memory = self.path("memory")
        (memory / "memory.limit_in_bytes").write_text(str(memory_bytes))
        swap = memory / "memory.memsw.limit_in_bytes"
        if swap.exists():  # no swapping past the limit either
            swap.write_text(str(memory_bytes))
        if uid is not None:
            # The launcher runs as the sandbox's uid when it joins.
            for tasks in self.tasks_files:
                os.chown(tasks, uid, gid if gid is not None else -1)

    def pids_refused(self) -> bool:
        """A fork or clone was refused at pids.max."""
        return _counter(self.path("pids") / "pids.events", "max") > 0

    def out_of_memory(self) -> bool:
        """The kernel killed a process of the step at its memory limit."""
        return _counter(self.path("memory") / "memory.oom_control", "oom_kill") > 0

    def cpu_seconds(self) -> float:
        try:
            return int((self.path("cpuacct") / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError):
            return 0.0

    def pids(self) -> list[int]:
        try:
            return [int(line) for line in (self.path("pids") / "tasks").read_text().split()]
        except OSError:
            return []

    def kill_all(self) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def remove(self, timeout: float = 5.0) -> None:
        """Kill what is left and remove the cgroups (a cgroup with a process in it cannot be
        removed; a process being killed leaves it a moment later)."""
        deadline = time.monotonic() + timeout
        while True:
            self.kill_all()
            left = []
            for controller in CONTROLLERS:
                try:
                    self.path(controller).rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    left.append(controller)
            if not left or time.monotonic() > deadline:
                return
            time.sleep(0.02)


def remove_stale(parent: str, older_than: float) -> int:
    """Remove step cgroups a dead worker left (its sandbox died with it, nobody removed them):
    empty ones older than `older_than` seconds (a live step's cgroup has its processes in it,
    and one being set up is seconds old). Returns how many went."""
    removed = 0
    now = time.time()
    for controller in CONTROLLERS:
        try:
            entries = list(os.scandir(_parent(controller, parent)))
        except OSError:
            continue
        for entry in entries:
            if not entry.name.startswith("step-") or not entry.is_dir():
                continue
            try:
                if now - entry.stat().st_mtime > older_than and not (Path(entry.path) / "tasks").read_text():
                    os.rmdir(entry.path)
                    removed += 1
            except OSError:
                pass  # in use again, or gone meanwhile
    return removed


def remove_orphans(parent: str, orphaned: Callable[[str], bool]) -> int:
    """Remove the step cgroups whose names `orphaned` picks (their worker process is gone:
    scriptsteps.leftovers), killing any process still in them first. Returns how many steps'
    cgroups went."""
    names: set[str] = set()
    for controller in CONTROLLERS:
        with contextlib.suppress(OSError):
            entries = os.scandir(_parent(controller, parent))
            names.update(entry.name for entry in entries if entry.is_dir() and orphaned(entry.name))
    for name in names:
        StepCgroup(name, parent).remove()
    return len(names)


def _counter(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0
