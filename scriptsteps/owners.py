"""Names that say which process made a thing on this machine (a directory, a cgroup): its
pid and its start time (since boot, in clock ticks, from /proc), so that a pid used again by
another process is not taken for it (scriptsteps.leftovers)."""

import os
import re
from pathlib import Path

# "<pid>.<start time>", after the kind's prefix and before the rest of the name.
_OWNED = re.compile(r"^(?:net|etc|step)-(\d+)\.(\d+)-")


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22; the command name (field 2, in parentheses) may itself hold spaces or ')'.
    return stat.rsplit(")", 1)[1].split()[19]


def owner_tag() -> str:
    """This process, as leftovers' names carry it."""
    pid = os.getpid()
    return f"{pid}.{_start_time(pid)}"


def owner_gone(name: str) -> bool:
    """Whether `name` is a leftover's whose process no longer runs (False for other names)."""
    match = _OWNED.match(name)
    if match is None:
        return False
    pid, started = match.groups()
    return _start_time(int(pid)) != started
