"""What a bridge holds, on disk, so that a bridge killed at any moment and started again
loses nothing: under `state_dir/runs/<run id>/`, `run.json` has the run, its lease, the
backend with its job handle (an orchestrator job, Bolt's pid, each SSH node's pid and exit
code files), the last state sent, and the final state until the service has taken it.

`lock` is held (flock) by the one process working the run: a second bridge on the same
host cannot take it, and a lock nobody holds means the run's worker died.

Everything here is the bridge's alone (run documents, Puppet's output, Bolt's inventory with
its password): directories 0700 and files 0600, whatever the umask the bridge was started
with (the CLI also sets 077, for the files ssh's and Bolt's wrappers write)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from relay_bridge import trust
from relay_bridge.logs import logger

DIR_MODE, FILE_MODE = 0o700, 0o600


class StateDirError(Exception):
    pass


def prepare(state_dir: Path) -> None:
    """Make `state_dir` and its `runs` 0700. An existing state_dir that others can read is
    tightened only when it holds nothing but `runs`: a mistyped `state_dir: /var` must be
    refused (StateDirError), not chmodded."""
    state_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    if os.stat(state_dir).st_mode & 0o077:
        if any(entry.name != "runs" for entry in state_dir.iterdir()):
            mode = oct(os.stat(state_dir).st_mode & 0o777)[2:]
            raise StateDirError(
                f"{state_dir} is open to other users (mode {mode}) and holds files that are not the"
                f" bridge's: give the bridge a directory of its own, or chmod 700 {state_dir}"
            )
        logger.warning(
            "state_dir was open to other users; made it 0700", extra={"fields": {"dir": state_dir}}
        )
        os.chmod(state_dir, DIR_MODE)
    make_dir(state_dir / "runs")


def make_dir(path: Path) -> None:
    """`path` 0700, also when it existed with a looser mode."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    if os.stat(path).st_mode & 0o077:
        os.chmod(path, DIR_MODE)


def private_file(path: Path, mode: str = "w") -> IO[Any]:
    """`path` opened for writing, created 0600 (an existing file is made 0600 too)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    return os.fdopen(fd, mode)


class RunRecord:
    def __init__(self, state_dir: Path, run_id: str) -> None:
        if not trust.run_id_ok(run_id):  # it becomes a path: never `/etc` or `../..`
            raise ValueError(f"not a run id: {trust.shown(run_id)}")
        self.run_id = run_id
        self.dir = state_dir / "runs" / run_id
        self.path = self.dir / "run.json"
        self._lock_fd: int | None = None
        self._document: dict[str, Any] | None = None  # what this object last read or wrote

    def lock(self) -> bool:
        """Take the run's lock; False when another process holds it."""
        make_dir(self.dir)
        fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, FILE_MODE)
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
        if self._document is None:
            try:
                document = json.loads(self.path.read_text())
            except (OSError, ValueError):
                document = {}
            self._document = document if isinstance(document, dict) else {}
        return self._document

    def save(self, **changes: Any) -> dict[str, Any]:
        """Merge `changes` in, durably: written aside, fsynced, then renamed over. Only the
        process holding the lock writes, so what this object holds is what is on disk."""
        document = {**self.load(), **changes}
        make_dir(self.dir)
        temporary = self.dir / "run.json.tmp"
        with private_file(temporary) as sink:
            json.dump(document, sink)
            sink.flush()
            os.fsync(sink.fileno())
        os.replace(temporary, self.path)
        directory = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        self._document = document
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
        return [
            RunRecord(state_dir, d.name)
            for d in sorted(runs.iterdir())
            if trust.run_id_ok(d.name) and (d / "run.json").exists()
        ]

    @staticmethod
    def orphans(state_dir: Path) -> Iterator[tuple[RunRecord, dict[str, Any]]]:
        """The runs a dead bridge process held (nobody holds their lock), with the run
        document of each. A record without one is unusable: it is removed."""
        for record in RunRecord.all(state_dir):
            if record.holder_alive():
                continue
            run = record.load().get("run")
            if isinstance(run, dict) and run.get("id") == record.run_id:
                yield record, run
            else:
                logger.error("unreadable run record; removing it", extra={"run_id": record.run_id})
                record.remove()

    def holder_alive(self) -> bool:
        """Whether some process holds the lock (taking it for a moment to find out)."""
        if self._lock_fd is not None:
            return True
        if not self.lock():
            return True
        self.unlock()
        return False
