"""What the bridge takes from the service, checked before it touches a path or a command
line: the bridge runs as root, so a service that is broken or not who it claims to be must
not be able to name a file or slip an option into ssh, Bolt or Puppet.

The rules are the service's own (runs/api/serializers.py), matched whole (`fullmatch`, so a
trailing newline is no loophole): a well-behaved service never sends anything else."""

from __future__ import annotations

import re
import uuid
from typing import Any

CERTNAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]*")
ENVIRONMENT_RE = re.compile(r"[a-z0-9_]+")
TASK_NAME_RE = re.compile(r"[a-z][a-z0-9_]*(::[a-z][a-z0-9_]*)*")
NAME_MAX = 255


def run_id_ok(value: Any) -> bool:
    """A run id is a UUID in its canonical form: it becomes a directory name."""
    if not isinstance(value, str):
        return False
    try:
        return str(uuid.UUID(value)) == value
    except ValueError:
        return False


def certname_ok(value: Any) -> bool:
    """Lowercase letters, digits, '.', '_' and '-', not starting with a punctuation mark: never
    an option (`-oProxyCommand=…`), a Bolt file (`@targets`), URI (`local://…`), glob or list."""
    return isinstance(value, str) and len(value) <= NAME_MAX and CERTNAME_RE.fullmatch(value) is not None


def environment_ok(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= NAME_MAX and ENVIRONMENT_RE.fullmatch(value) is not None


def task_name_ok(value: Any) -> bool:
    """`module` or `module::name`: it goes on Bolt's command line."""
    return isinstance(value, str) and len(value) <= NAME_MAX and TASK_NAME_RE.fullmatch(value) is not None


def shown(value: Any) -> str:
    """A value the service sent, safe and short enough for a log line."""
    return repr(value)[:120]
