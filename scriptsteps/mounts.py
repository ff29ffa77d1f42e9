"""What a sandbox mounts from the worker's machine, where its own uid can reach it.

bubblewrap opens each source path as the sandbox's uid (STEP_SANDBOX_UID… under a root
worker), which needs search permission on every directory above it: a checkout inside a 0700
directory (a home directory, /root, a `mktemp -d`) hides `ni` and `.step-python/` from it,
and files checked out under umask 077 are unreadable to it. So the sandbox never mounts the
checkout: `ni` and `.step-python/` are copied into STEP_MOUNT_DIR (owned by the worker, mode
0755, every directory above it searchable by anyone), with modes the sandbox's uid can read
(directories and executables 0755, other files 0644); the generated /etc and each step's
network directory are made there too.

A copy is made once per version of its source, and a new one when the source changes (`ni`:
its inode, size or mtime; `.step-python/`: the directory's inode or mtime, or its `.installed`
marker's, which `make` rewrites), by any worker of the machine: built under a temporary name
and renamed into place, so a sandbox never sees half a copy. Copies of older versions not used
for longer than any step runs are removed.
"""

import contextlib
import hashlib
import os
import shutil
import stat
import tempfile
import threading
import time
from pathlib import Path

from django.conf import settings

from scriptsteps.owners import owner_tag


class Unreachable(Exception):
    """STEP_MOUNT_DIR cannot be made, or is not where a sandbox's uid can reach it."""


_lock = threading.Lock()
_checked: set[Path] = set()


def root() -> Path:
    """STEP_MOUNT_DIR, made (0755) and checked: owned by this worker, writable by it alone,
    and, under a root worker, every directory above it searchable by others (the sandbox's
    uid is neither their owner nor in their group)."""
    path = Path(settings.STEP_MOUNT_DIR)
    with _lock:
        if path in _checked and path.is_dir():
            return path
        try:
            path.mkdir(mode=0o755, parents=True, exist_ok=True)
            info = path.lstat()
        except OSError as exc:
            raise Unreachable(f"STEP_MOUNT_DIR ({path}) cannot be made: {exc.strerror}.") from exc
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
            raise Unreachable(
                f"STEP_MOUNT_DIR ({path}) must be a directory of this worker's user that no one "
                "else may write to."
            )
        os.chmod(path, 0o755)  # noqa: S103 (read by the sandboxes' uids; nothing secret)
        # A root worker's sandboxes run as uids of their own; another's, as the worker.
        for parent in path.resolve().parents if os.geteuid() == 0 else ():
            if not parent.stat().st_mode & stat.S_IXOTH:
                raise Unreachable(
                    f"The sandboxes' uid cannot reach STEP_MOUNT_DIR ({path}): {parent} is mode "
                    f"{stat.S_IMODE(parent.stat().st_mode):04o}. Choose a STEP_MOUNT_DIR whose "
                    "parents anyone may search (the default: /run/relay-step-mounts under root)."
                )
        _checked.add(path)
        return path


def ni() -> Path | None:
    """The copy of STEP_NI to mount (None when there is no `ni` to copy)."""
    source = Path(settings.STEP_NI)
    try:
        info = source.stat()
    except OSError:
        return None
    return _copy(source, "ni", (info.st_ino, info.st_size, info.st_mtime_ns)) / "ni"


def python_dir() -> Path:
    """The copy of STEP_PYTHON_DIR (relay_sdk and its dependencies) to mount."""
    source = Path(settings.STEP_PYTHON_DIR)
    info = source.stat()
    marker = source / ".installed"
    version: tuple[int, ...] = (info.st_ino, info.st_mtime_ns)
    with contextlib.suppress(OSError):
        made = marker.stat()
        version += (made.st_ino, made.st_mtime_ns)
    return _copy(source, "python", version) / "python"


def private_dir(prefix: str) -> Path:
    """A new directory under STEP_MOUNT_DIR, mode 0700, for the caller to set up (and remove),
    named after this process (scriptsteps.leftovers removes it once the process is gone)."""
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{owner_tag()}-", dir=root()))


def _copy(source: Path, name: str, version: tuple[int, ...]) -> Path:
    """The directory holding `name`, a copy of `source` at `version`, made if needed."""
    key = hashlib.sha256(repr((str(source.resolve()), version)).encode()).hexdigest()[:24]
    place = root() / f"{name}-{key}"
    if not place.is_dir():
        building = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root()))
        try:
            target = building / name
            if source.is_dir():
                shutil.copytree(source, target, symlinks=True)
            else:
                shutil.copy2(source, target)
            _readable(building)
            try:
                os.rename(building, place)
            except OSError:  # another worker made it first: theirs is the same
                shutil.rmtree(building, ignore_errors=True)
        except OSError as exc:
            shutil.rmtree(building, ignore_errors=True)
            raise Unreachable(f"{source} could not be copied into STEP_MOUNT_DIR: {exc}") from exc
        _remove_stale(name, place)
    with contextlib.suppress(OSError):
        os.utime(place)  # in use: not stale
    return place


def _readable(top: Path) -> None:
    """Directories and executables 0755, other files 0644; symlinks as they are."""
    for directory, _, files in os.walk(top):
        os.chmod(directory, 0o755)  # noqa: S103
        for file in files:
            path = os.path.join(directory, file)
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode):
                os.chmod(path, 0o755 if mode & 0o111 else 0o644)


def _remove_stale(name: str, current: Path) -> None:
    """Other versions' copies not used for longer than a step may run (with a margin)."""
    older_than = time.time() - (settings.STEP_WALL_TIME + 300)
    for other in root().glob(f"{name}-*"):
        with contextlib.suppress(OSError):
            if other != current and other.stat().st_mtime < older_than:
                shutil.rmtree(other)
