"""Running one step's program in bubblewrap, within its limits, reading its output as it comes.

What the sandbox sees (docs/script-steps.md "Script steps"):
- its own user (uid 1000 inside; outside, STEP_SANDBOX_UID when the worker is root, else the
  worker's own uid), no capabilities, no further user namespaces; its own pid, ipc, uts and
  network namespaces: of the network, only its own loopback, where the runtime API (and with
  STEP_NETWORK, an HTTP proxy to public addresses) listen, served by this worker
  (network.py) through Unix sockets at /run/relay;
- the system's /usr read-only (bash, jq, curl, python3), a /usr/local of its own holding only
  `ni` (and relay_sdk for the python image), a minimal /etc (generated passwd, group, hosts and
  nsswitch.conf; the host's CA certificates, resolv.conf, ld.so.cache and alternatives);
- a private writable /work (its working directory and HOME) and /tmp, tmpfs of
  STEP_WORK_DIR_BYTES each, gone when the step ends; the root itself is read-only.
Nothing else: not the repository, var/, the virtualenv, /root, the Vault token, the database's
socket, nor any other step's /work (each step's is its own tmpfs, in its own mount namespace).

Limits: wall time (the supervisor's clock), output size (it stops reading and kills), and,
through the step's cgroups (cgroups.py) when the worker may make them, processes (pids.max),
memory (memory.limit_in_bytes) and CPU (summed over the step's processes); without cgroups,
rlimits: RLIMIT_NPROC on the sandbox's own uid (a root worker gives each sandbox a uid of its
own, UidSlot), RLIMIT_AS and RLIMIT_CPU for each process.
"""

import errno
import fcntl
import os
import selectors
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from scriptsteps import cgroups, mounts, network

SCRIPT_PATH = "/var/run/puppet/relay/config/input-script"  # where relay-core mounts `input`
PYTHON_PATH = "/usr/local/lib/relay-python"
INSIDE_UID = 1000
READ_SIZE = 65536
HEAD_BYTES = 2048

# The launcher joins the step's cgroups and lowers its rlimits, then becomes bubblewrap: run
# by dash (about 1 ms), so nothing of Python runs between fork and exec in a worker that may
# have threads. $1: how many cgroup `tasks` files follow; then CPU seconds, KiB of address
# space and processes for ulimit ("-": left as it is, where a cgroup bounds it instead); then
# the command.
LAUNCHER = """\
n=$1; shift
while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n - 1)); done
{ [ "$1" = - ] || ulimit -t "$1"; } && { [ "$2" = - ] || ulimit -v "$2"; } &&
{ [ "$3" = - ] || ulimit -p "$3"; } || exit 125
shift 3
exec "$@"
"""
LAUNCH_FAILED = 125  # bwrap exits 1 when it cannot set up; the launcher says 125


@dataclass(frozen=True)
class Limits:
    wall_seconds: float
    cpu_seconds: int
    memory_bytes: int
    processes: int
    output_bytes: int
    work_dir_bytes: int

    @classmethod
    def from_settings(cls) -> "Limits":
        return cls(
            wall_seconds=settings.STEP_WALL_TIME,
            cpu_seconds=settings.STEP_CPU_SECONDS,
            memory_bytes=settings.STEP_MEMORY_BYTES,
            processes=settings.STEP_MAX_PROCESSES,
            output_bytes=settings.STEP_OUTPUT_BYTES,
            work_dir_bytes=settings.STEP_WORK_DIR_BYTES,
        )


@dataclass(frozen=True)
class Program:
    """What runs inside: `argv`, or with `script` the script (at SCRIPT_PATH, mode 0755)."""

    argv: Sequence[str]
    env: Mapping[str, str]
    script: str | None = None
    python: bool = False  # relay_sdk importable (relaysh/core:latest-python)
    network: bool = True


@dataclass
class Result:
    exit_code: int | None  # None when it was stopped (see reason)
    reason: str = ""  # why it was stopped, for people; "" when it ended by itself
    spawned_at: float = 0.0  # time.monotonic()
    first_output_at: float | None = None
    ended_at: float = 0.0
    output_bytes: int = 0
    cgroups: bool = False
    head: bytes = b""  # the output's first HEAD_BYTES (why a sandbox could not start)
    started: bool = True  # False: the sandbox never started the step's program
    system_error: bool = False  # the machine's doing, not the step's

    @property
    def success(self) -> bool:
        return self.exit_code == 0 and not self.reason


@dataclass
class _Stop:
    reason: str = ""
    extra: list[str] = field(default_factory=list)


def use_cgroups() -> bool:
    """Per STEP_CGROUPS: "true" insists (a worker that cannot make them refuses to run
    steps), "false" never, "auto" when this worker may make them."""
    wanted = settings.STEP_CGROUPS.lower()
    if wanted in ("false", "0", "no", "off"):
        return False
    can = cgroups.available(settings.STEP_CGROUP_PARENT)
    if not can and wanted in ("true", "1", "yes", "on"):
        raise SandboxUnavailable(
            f"STEP_CGROUPS is on, but this worker cannot make cgroups under "
            f"{cgroups.ROOT}/<pids|memory|cpuacct>/{settings.STEP_CGROUP_PARENT}."
        )
    return can


class SandboxUnavailable(Exception):
    """This worker cannot run sandboxes (no bubblewrap, or cgroups it was told to use)."""


class UidSlot:
    """A uid of its own for one sandbox, from STEP_SANDBOX_UID … + STEP_SANDBOX_UIDS - 1, held
    (an flock on a file per uid, so across every worker process of the machine) while the
    sandbox runs. Its own uid makes RLIMIT_NPROC, which counts a real uid's processes, a limit
    of this step alone, and lets the supervisor count the step's processes without cgroups.
    Only a root worker can change uid; any other's sandbox runs as the worker (uid None)."""

    def __init__(self) -> None:
        self.uid: int | None = None
        self.gid: int | None = None
        self._fd: int | None = None

    def __enter__(self) -> "UidSlot":
        if os.geteuid() != 0:
            return self
        locks = Path(settings.STEP_SANDBOX_UID_LOCKS)
        locks.mkdir(mode=0o700, parents=True, exist_ok=True)
        for uid in range(settings.STEP_SANDBOX_UID, settings.STEP_SANDBOX_UID + settings.STEP_SANDBOX_UIDS):
            fd = os.open(locks / str(uid), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            if _processes_of(uid):  # a sandbox of a worker that died, not yet gone
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
                continue
            self.uid, self.gid, self._fd = uid, settings.STEP_SANDBOX_GID, fd
            return self
        raise SandboxUnavailable(
            f"All {settings.STEP_SANDBOX_UIDS} sandbox uids (STEP_SANDBOX_UID, STEP_SANDBOX_UIDS) "
            "are in use: more scripts at once on this machine than it has uids for."
        )

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _processes_of(uid: int) -> int:
    """How many processes the real uid `uid` has (what RLIMIT_NPROC counts, threads aside)."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat(follow_symlinks=False).st_uid == uid:
                    count += 1
            except OSError:
                pass
    return count


_etc_lock = threading.Lock()
_etc_dir: Path | None = None

ETC_FILES = {
    "passwd": "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
    f"step:x:{INSIDE_UID}:{INSIDE_UID}:step:/work:/bin/sh\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "group": f"root:x:0:\nstep:x:{INSIDE_UID}:\nnogroup:x:65534:\n",
    "hosts": "127.0.0.1\tlocalhost relay-step\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    # No DNS: nothing in the sandbox's network could answer it (the proxy resolves names).
    "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
    "hostname": "relay-step\n",
}
# From the host, read-only, when present: TLS roots, the dynamic linker's cache.
HOST_ETC = ("ssl", "ca-certificates", "ca-certificates.conf", "alternatives", "ld.so.cache", "localtime")


def _etc() -> Path:
    """The generated /etc files, written once per worker process (world-readable: the
    sandbox's uid reads them when bubblewrap binds them), under STEP_MOUNT_DIR."""
    global _etc_dir
    with _etc_lock:
        if _etc_dir is None or not _etc_dir.exists():
            path = mounts.private_dir("etc-")
            os.chmod(path, 0o755)  # noqa: S103 (the sandbox's uid reads them; nothing secret)
            for name, text in ETC_FILES.items():
                (path / name).write_text(text)
                os.chmod(path / name, 0o644)
            _etc_dir = path
        return _etc_dir


def bwrap_args(program: Program, limits: Limits, script_fd: int | None, net_dir: Path) -> list[str]:
    args = [
        settings.STEP_BWRAP,
        "--unshare-user",
        "--uid",
        str(INSIDE_UID),
        "--gid",
        str(INSIDE_UID),
        "--disable-userns",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--unshare-net",
        "--hostname",
        "relay-step",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = Path("/") / top
        if host.is_symlink():  # merged /usr: /bin -> usr/bin
            args += ["--symlink", os.readlink(host), f"/{top}"]
        elif host.is_dir():
            args += ["--ro-bind", str(host), f"/{top}"]
    # A /usr/local of its own: the host's stays out of sight.
    args += ["--tmpfs", "/usr/local", "--dir", "/usr/local/bin"]
    # Copies under STEP_MOUNT_DIR, never the checkout itself (mounts.py).
    ni = mounts.ni()
    if ni is not None:
        args += ["--ro-bind", str(ni), "/usr/local/bin/ni"]
    if program.python:
        args += ["--ro-bind", str(mounts.python_dir()), PYTHON_PATH]
        args += ["--symlink", "/usr/bin/python3", "/usr/local/bin/python"]
    args += ["--remount-ro", "/usr/local", "--dir", "/etc"]
    etc = _etc()
    for name in ETC_FILES:
        args += ["--ro-bind", str(etc / name), f"/etc/{name}"]
    for name in HOST_ETC:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    args += ["--proc", "/proc", "--dev", "/dev", "--ro-bind", str(net_dir), network.INSIDE_DIR]
    for path in ("/work", "/tmp"):  # noqa: S108 (paths inside the sandbox, each its own tmpfs)
        args += ["--size", str(limits.work_dir_bytes), "--perms", "0700", "--tmpfs", path]
    if script_fd is not None:
        args += ["--perms", "0755", "--ro-bind-data", str(script_fd), SCRIPT_PATH]
    args += ["--remount-ro", "/", "--chdir", "/work", "--"]
    args += network.wrapper_argv(program.network)
    return [*args, *program.argv]


def sandbox_env(program: Program) -> dict[str, str]:
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/work",
        "TMPDIR": "/tmp",  # noqa: S108 (the sandbox's own tmpfs)
        "LANG": "C.UTF-8",
        "USER": "step",
        "LOGNAME": "step",
        "PYTHONUNBUFFERED": "1",  # a step's prints reach the log as they happen
        **({"PYTHONPATH": PYTHON_PATH} if program.python else {}),
        **network.inside_env(program.network),
    }
    env.update(program.env)
    return env


def run(
    program: Program,
    limits: Limits,
    on_output: Callable[[bytes], None],
    tick: Callable[[], str | None] = lambda: None,
    tick_every: float = 0.25,
    kill_hook: Callable[[], None] | None = None,
) -> Result:
    """Run `program` to its end or until a limit, or `tick` (called every `tick_every`
    seconds, e.g. to store the log and heartbeat), returns a reason to stop it. Its output
    (stdout and stderr together) goes to `on_output` as it comes, at most
    `limits.output_bytes` of it. Raises SandboxUnavailable when it cannot start at all."""
    if not Path(settings.STEP_BWRAP).exists():
        raise SandboxUnavailable(f"bubblewrap is not installed at {settings.STEP_BWRAP} (STEP_BWRAP).")
    if not Path(network.SOCAT).exists():
        raise SandboxUnavailable(
            f"socat is not installed at {network.SOCAT} (the sandbox's network needs it)."
        )
    if program.python and not Path(settings.STEP_PYTHON_DIR).is_dir():
        raise SandboxUnavailable(
            f"relay_sdk for relaysh/core:latest-python is not installed on this worker "
            f"({settings.STEP_PYTHON_DIR}; `make .step-python/.installed` builds it)."
        )
    try:
        with UidSlot() as slot, network.StepNetwork(program.network, slot.uid, slot.gid) as doors:
            return _run(program, limits, on_output, tick, tick_every, kill_hook, slot, doors.directory)
    except mounts.Unreachable as exc:
        raise SandboxUnavailable(str(exc)) from exc


def _run(
    program: Program,
    limits: Limits,
    on_output: Callable[[bytes], None],
    tick: Callable[[], str | None],
    tick_every: float,
    kill_hook: Callable[[], None] | None,
    slot: UidSlot,
    net_dir: Path,
) -> Result:
    uid, gid = slot.uid, slot.gid
    group = (
        cgroups.StepCgroup(f"step-{uuid.uuid4().hex}", settings.STEP_CGROUP_PARENT) if use_cgroups() else None
    )
    if group is not None:
        cgroups.remove_stale(settings.STEP_CGROUP_PARENT, older_than=settings.STEP_WALL_TIME + 300)
    script_fd = None
    started_r, started_w = os.pipe()
    try:
        if group is not None:
            group.create(limits.processes, limits.memory_bytes, uid, gid)
        if program.script is not None:
            script_fd = os.memfd_create("input-script", 0)  # inherited: bwrap copies it in
            os.write(script_fd, program.script.encode())
            os.lseek(script_fd, 0, os.SEEK_SET)
        ulimits = [
            "-" if group else str(limits.cpu_seconds),
            "-" if group else str(max(limits.memory_bytes // 1024, 1)),
            "-" if group else str(limits.processes),
        ]
        tasks = group.tasks_files if group else []
        argv = ["/bin/sh", "-c", LAUNCHER, "launch", str(len(tasks)), *tasks, *ulimits]
        argv += bwrap_args(program, limits, script_fd, net_dir)
        # Its stdin: where the sandbox's first process says it started (network.WRAPPER), so
        # a sandbox that never started is told apart from a program that failed.
        process, result = _spawn(
            argv,
            stdin=started_w,
            env=sandbox_env(program),
            pass_fds=(script_fd,) if script_fd is not None else (),
            user=uid,
            group=gid,
            extra_groups=[] if uid is not None else None,
        )
        result.cgroups = group is not None
        os.close(started_w)
        started_w = -1
        if script_fd is not None:
            os.close(script_fd)
            script_fd = None
        counted = uid if group is None else None
        result = _supervise(process, group, limits, on_output, tick, tick_every, result, kill_hook, counted)
        os.set_blocking(started_r, False)
        try:
            result.started = bool(os.read(started_r, 1))
        except BlockingIOError:
            result.started = False
        if not result.started and result.exit_code is not None and not result.reason:
            # Nothing of the step's ran: what was printed is bubblewrap's (or the launcher's,
            # or the network wrapper's) reason.
            said = result.head.decode(errors="replace").strip()
            said = said or _why_it_ended(result.exit_code, group, limits)
            result.reason = f"The sandbox could not start: {said}"
            result.system_error = True
        elif result.exit_code is not None and not result.reason:
            result.reason = _why_it_ended(result.exit_code, group, limits)
        return result
    finally:
        os.close(started_r)
        if started_w >= 0:
            os.close(started_w)
        if script_fd is not None:
            os.close(script_fd)
        if group is not None:
            group.remove()


def run_command(
    argv: Sequence[str],
    env: Mapping[str, str],
    limits: Limits,
    on_output: Callable[[bytes], None],
    tick: Callable[[], str | None] = lambda: None,
    tick_every: float = 0.25,
    kill_hook: Callable[[], None] | None = None,
) -> Result:
    """Any command (a container runtime's `run`, container.py) supervised as a sandbox is:
    wall time, output size, `tick`; the command enforces the other limits itself."""
    process, result = _spawn(argv, env=dict(env))
    return _supervise(process, None, limits, on_output, tick, tick_every, result, kill_hook)


def _spawn(argv: Sequence[str], **popen: Any) -> tuple[subprocess.Popen, Result]:
    result = Result(exit_code=None, spawned_at=time.monotonic())
    popen.setdefault("stdin", subprocess.DEVNULL)
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: killed as one
        cwd="/",
        **popen,
    )
    return process, result


def _supervise(
    process: subprocess.Popen,
    group: cgroups.StepCgroup | None,
    limits: Limits,
    on_output: Callable[[bytes], None],
    tick: Callable[[], str | None],
    tick_every: float,
    result: Result,
    kill_hook: Callable[[], None] | None,
    counted_uid: int | None = None,
) -> Result:
    """`counted_uid`: the sandbox's own uid when no cgroup counts its processes."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    os.set_blocking(fd, False)
    selector = selectors.DefaultSelector()
    selector.register(fd, selectors.EVENT_READ)
    deadline = result.spawned_at + limits.wall_seconds
    next_tick = result.spawned_at + tick_every
    stop = _Stop()
    open_pipe = True
    try:
        while True:
            now = time.monotonic()
            if open_pipe:
                for _ in selector.select(timeout=max(min(next_tick, deadline) - now, 0)):
                    chunk = _read(fd)
                    if chunk is None:
                        continue
                    if not chunk:
                        open_pipe = False
                        selector.unregister(fd)
                        break
                    if result.first_output_at is None:
                        result.first_output_at = time.monotonic()
                    if len(result.head) < HEAD_BYTES:
                        result.head += chunk[: HEAD_BYTES - len(result.head)]
                    room = limits.output_bytes - result.output_bytes
                    on_output(chunk[: max(room, 0)])
                    result.output_bytes += min(len(chunk), max(room, 0))
                    if len(chunk) > room:
                        stop.reason = (
                            f"The step printed more than {limits.output_bytes} bytes of output "
                            "(STEP_OUTPUT_BYTES); it was stopped."
                        )
            elif process.poll() is None:
                time.sleep(max(min(min(next_tick, deadline) - now, 0.05), 0))
            if not open_pipe and process.poll() is not None:
                break
            now = time.monotonic()
            if not stop.reason and now >= deadline:
                stop.reason = (
                    f"The step ran longer than {limits.wall_seconds:g} seconds (STEP_WALL_TIME); "
                    "it was stopped."
                )
            if not stop.reason and now >= next_tick:
                next_tick = now + tick_every
                stop.reason = tick() or _over_limits(group, limits, counted_uid)
            if stop.reason:
                _kill(process, group, kill_hook)
                _drain(fd, open_pipe)
                process.wait()
                break
    finally:
        selector.close()
        process.stdout.close()
    result.ended_at = time.monotonic()
    if stop.reason:
        result.reason = stop.reason
        return result
    result.exit_code = process.returncode
    return result


def _read(fd: int) -> bytes | None:
    try:
        return os.read(fd, READ_SIZE)
    except BlockingIOError:
        return None
    except OSError as exc:
        if exc.errno == errno.EIO:
            return b""
        raise


def _drain(fd: int, open_pipe: bool) -> None:
    """Whatever is left in the pipe once the step is killed is dropped (not stored)."""
    if not open_pipe:
        return
    try:
        while os.read(fd, READ_SIZE):
            pass
    except OSError:
        pass


def _over_limits(group: cgroups.StepCgroup | None, limits: Limits, counted_uid: int | None) -> str | None:
    if group is None:
        # Without cgroups, the step's own uid: a step at RLIMIT_NPROC is one whose forks fail.
        if counted_uid is not None and _processes_of(counted_uid) >= limits.processes:
            return (
                f"The step tried to run more than {limits.processes} processes at once "
                "(STEP_MAX_PROCESSES); it was stopped."
            )
        return None
    if group.pids_refused():
        # A fork bomb never ends by itself: its forks fail and it retries, so it is stopped.
        return (
            f"The step tried to run more than {limits.processes} processes at once "
            "(STEP_MAX_PROCESSES); it was stopped."
        )
    if group.cpu_seconds() > limits.cpu_seconds:
        return (
            f"The step used more than {limits.cpu_seconds} seconds of CPU (STEP_CPU_SECONDS); it was stopped."
        )
    return None


def _why_it_ended(code: int, group: cgroups.StepCgroup | None, limits: Limits) -> str:
    """An exit that a limit caused, said as such ("" for an ordinary exit, whatever its code)."""
    mib = limits.memory_bytes // (1024 * 1024)
    if group is not None and group.out_of_memory():
        return f"The step ran out of memory: its processes used more than {mib} MiB (STEP_MEMORY_BYTES)."
    if group is not None and group.cpu_seconds() > limits.cpu_seconds:
        return f"The step used more than {limits.cpu_seconds} seconds of CPU (STEP_CPU_SECONDS)."
    if group is not None and group.pids_refused():
        return f"The step tried to run more than {limits.processes} processes at once (STEP_MAX_PROCESSES)."
    if code == LAUNCH_FAILED:
        return "The sandbox could not be set up (its limits, cgroups or network could not be applied)."
    if code in (128 + signal.SIGXCPU, -signal.SIGXCPU):
        return f"The step used more than {limits.cpu_seconds} seconds of CPU (STEP_CPU_SECONDS)."
    return ""


def _kill(
    process: subprocess.Popen, group: cgroups.StepCgroup | None, kill_hook: Callable[[], None] | None
) -> None:
    """bubblewrap, and with it (--die-with-parent, and its pid namespace) everything inside."""
    if kill_hook is not None:
        kill_hook()
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if group is not None:
        group.kill_all()
