"""What a bridge holds, on disk, so that a bridge killed at any moment and started again
loses nothing: under `state_dir/runs/<run id>/`, `run.json` has the run, its lease, the
backend with its job handle (an orchestrator job, Bolt's pid, each SSH node's pid and exit
code files), the last state sent, and the final state until the service has taken it.

`lock` is held (flock) by the one process working the run: a second bridge on the same
host cannot take it, and a lock nobody holds means the run's worker died."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from pathlib import Path
from typing import Any


class RunRecord:
    def __init__(self, state_dir: Path, run_id: str) -> None:
        self.run_id = run_id
        self.dir = state_dir / "runs" / run_id
        self.path = self.dir / "run.json"
        self._lock_fd: int | None = None

    def lock(self) -> bool:
        """Take the run's lock; False when another process holds it."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.set_inheritable(fd, False)  # Puppet's processes must not keep it
        self._lock_fd = fd
        return True

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def load(self) -> dict[str, Any]:
        try:
            document = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return document if isinstance(document, dict) else {}

    def save(self, **changes: Any) -> dict[str, Any]:
        """Merge `changes` in, durably: written aside, fsynced, then renamed over."""
        document = {**self.load(), **changes}
        self.dir.mkdir(parents=True, exist_ok=True)
        temporary = self.dir / "run.json.tmp"
        with temporary.open("w") as sink:
            json.dump(document, sink)
            sink.flush()
            os.fsync(sink.fileno())
        os.replace(temporary, self.path)
        directory = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        return document

    def remove(self) -> None:
        """The run is done with: its record and work files go, then the lock."""
        shutil.rmtree(self.dir, ignore_errors=True)
        self.unlock()

    @staticmethod
    def all(state_dir: Path) -> list[RunRecord]:
        runs = state_dir / "runs"
        if not runs.is_dir():
            return []
        return [RunRecord(state_dir, d.name) for d in sorted(runs.iterdir()) if (d / "run.json").exists()]

    def holder_alive(self) -> bool:
        """Whether some process holds the lock (without taking it for long)."""
        if not (self.dir / "lock").exists():
            return False
        fd = os.open(self.dir / "lock", os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
        return False
