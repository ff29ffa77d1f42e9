"""`make run` is ready for what it offers: what script steps need is installed before it
starts, or one line says how; `make createsuperuser` works with and without a terminal."""

import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.settings import outside_env

ROOT = Path(__file__).resolve().parent.parent
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]


def as_nobody(*args: str, **env: str) -> subprocess.CompletedProcess:
    """A user who is not root and may not sudo, as on a laptop without passwordless sudo."""
    return subprocess.run(
        [*NOBODY, *args],
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_make_run_installs_what_script_steps_need_before_it_starts():
    # A dry run (-n) prints the commands without running any.
    planned = subprocess.run(
        ["make", "-n", "run"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    installs = planned.index("scripts/install-system-packages steps")
    starts = next(i for i, line in enumerate(planned) if line.endswith("-m relay.embedded"))
    assert installs < starts, planned


@pytest.fixture
def install() -> Iterator[str]:
    """The script, where the other user can read it: the checkout may be inside a 0700 home
    directory (CI clones into one)."""
    directory = Path(tempfile.mkdtemp(prefix="relay-install-test-", dir="/tmp"))
    directory.chmod(0o755)
    script = directory / "install-system-packages"
    shutil.copy(ROOT / "scripts" / "install-system-packages", script)
    script.chmod(0o755)
    yield str(script)
    shutil.rmtree(directory)


def test_without_bubblewrap_and_without_root_it_says_in_one_line_how_to_install_and_starts(install):
    # The check looks where the sandbox looks (STEP_BWRAP): pointed elsewhere, bubblewrap is missing.
    told = as_nobody(install, "steps", STEP_BWRAP="/nonexistent/bwrap")
    assert told.returncode == 0  # the service starts; only its script steps would fail
    assert told.stdout == ""
    assert told.stderr.splitlines() == [
        "[relay] script steps cannot run until these are installed: sudo apt-get install bubblewrap "
        "(or run make run as root; the rest of the service works without them)"
    ]
    # Everything there (this machine has them): nothing said.
    quiet = as_nobody(install, "steps")
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")
    # `make test` needs them all: without root it fails, saying what to install.
    refused = as_nobody(install, STEP_BWRAP="/nonexistent/bwrap")
    assert refused.returncode == 1
    assert refused.stderr.splitlines() == [
        "need root (or passwordless sudo) to install: sudo apt-get install bubblewrap"
    ]


def embedded(var: Path, *args: str, stdin=subprocess.DEVNULL, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "relay.embedded", *args],
        cwd=ROOT,
        env=outside_env(RELAY_VAR_DIR=str(var), **env),
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


CHECK_ADMIN = (
    "from django.contrib.auth import authenticate;"
    "user = authenticate(username='admin', password='Correct-Horse-9');"
    "print(user.username, user.email, user.is_superuser, user.is_staff)"
)


@pytest.mark.django_db(False)
def test_createsuperuser_takes_the_environment_without_a_terminal_and_asks_on_one(tmp_path):
    var = tmp_path / "var"
    assert embedded(var, "manage", "migrate", "--noinput", "-v0").returncode == 0

    # No terminal and nothing set: one line saying what to set, and a failure a script sees
    # (Django's own command prints that it skipped, and exits 0).
    bare = embedded(var, "createsuperuser")
    assert bare.returncode == 2
    assert bare.stderr.splitlines() == [
        "make createsuperuser: no terminal to ask on; set DJANGO_SUPERUSER_USERNAME, "
        "DJANGO_SUPERUSER_EMAIL, DJANGO_SUPERUSER_PASSWORD (README, make run)"
    ]
    partial = embedded(var, "createsuperuser", DJANGO_SUPERUSER_USERNAME="admin")
    assert partial.returncode == 2
    assert partial.stderr.splitlines() == [
        "make createsuperuser: DJANGO_SUPERUSER_EMAIL, DJANGO_SUPERUSER_PASSWORD not set "
        "(it takes all three, or none on a terminal)"
    ]

    made = embedded(
        var,
        "createsuperuser",
        DJANGO_SUPERUSER_USERNAME="admin",
        DJANGO_SUPERUSER_EMAIL="admin@example.com",
        DJANGO_SUPERUSER_PASSWORD="Correct-Horse-9",
    )
    assert made.returncode == 0, made.stderr
    checked = embedded(var, "manage", "shell", "-c", CHECK_ADMIN)
    assert checked.stdout.splitlines()[-1].split() == ["admin", "admin@example.com", "True", "True"], (
        checked.stderr
    )

    # On a terminal with nothing set, Django asks.
    leader, follower = os.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "relay.embedded", "createsuperuser"],
        cwd=ROOT,
        env=outside_env(RELAY_VAR_DIR=str(var)),
        stdin=follower,
        stdout=follower,
        stderr=follower,
    )
    os.close(follower)
    seen = b""
    try:
        deadline = time.monotonic() + 120
        while b"Username" not in seen and time.monotonic() < deadline:
            if select.select([leader], [], [], 1)[0]:
                try:
                    seen += os.read(leader, 1024)
                except OSError:
                    break
        assert b"Username" in seen, seen
    finally:
        process.kill()
        process.wait()
        os.close(leader)
