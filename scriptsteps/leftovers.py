"""What a steps worker's processes leave on their machine when they end without cleaning up
(SIGKILL, a crash, the kernel's OOM killer): each running step's network directory (`net-…`)
and each process's generated /etc (`etc-…`, kept for the process's life, so left even by a
clean stop) under STEP_MOUNT_DIR, and each running step's cgroups (`step-…`).

Each is named after the process that made it (scriptsteps.owners). Every steps worker, as
it starts (scriptsteps.tasks), removes those whose process is gone, and none of another
worker's that still runs: several steps workers may share a machine."""

import contextlib
import logging
import os
import shutil

from django.conf import settings

from scriptsteps import cgroups, mounts
from scriptsteps.owners import owner_gone

logger = logging.getLogger(__name__)


def clean() -> tuple[int, int]:
    """Remove the directories and step cgroups of this machine's steps-worker processes that
    are gone. Returns how many directories and cgroups went."""
    directories = 0
    with contextlib.suppress(OSError, mounts.Unreachable):
        for entry in os.scandir(mounts.root()):
            if entry.is_dir(follow_symlinks=False) and owner_gone(entry.name):
                shutil.rmtree(entry.path, ignore_errors=True)
                directories += 1
    groups = cgroups.remove_orphans(settings.STEP_CGROUP_PARENT, owner_gone)
    if directories or groups:
        logger.info(
            "Removed what steps workers that are gone left: %d directories under %s, %d step cgroups",
            directories,
            settings.STEP_MOUNT_DIR,
            groups,
        )
    return directories, groups
