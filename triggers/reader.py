"""Reading one event's report in a child process with limits: what the worker does with a body.

Why a child process, beside the checks in parsing.py: the readers are C and C++ (libyaml,
rapidyaml, json) fed untrusted documents, and a check made before them bounds only the
faults we know of (parsing._check_depth bounds libyaml's recursive composer). A process
boundary bounds the rest, and it is the only hard bound on memory and time: a YAML report
costs 13 to 35 times its size in Python objects, and a document can be built to cost far
more per byte. So the worker forks (nothing is imported or set up again: a few milliseconds),
the child takes an address-space limit, a CPU-time limit and no core dumps, reads the body
from a file descriptor, summarises and filters it, writes the parts to offload into
anonymous temporary files, and sends its outcome as JSON through a pipe. The worker never
holds the parsed document, so its own memory does not grow with reports; a child that runs
out of memory or time, or crashes, ends its event `failed` with the reason, and nothing else.

The child touches neither the database nor storage: it shares the worker's connections,
which only the worker may use. It leaves by os._exit, so nothing of the worker's is closed,
flushed or cleaned up twice.
"""

import ctypes
import gc
import hashlib
import json
import math
import os
import resource
import select
import signal
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, BinaryIO, NoReturn

import ryml  # noqa: F401 - imported once here, not again in every child (30 ms)
from django.conf import settings

from triggers import parsing
from triggers.models import BodyFormat
from triggers.reports import Filters, analyse, events_of, logs_of

PARTS = ("report", "logs", "events")
PR_SET_PDEATHSIG = 1


class Failed(Exception):
    """The document could not be read; the message says why, for the event."""

    def __init__(self, reason: str, detail: str, seconds: float, peak_rss: int) -> None:
        super().__init__(reason)
        self.detail = detail  # a traceback, for the worker's log
        self.seconds = seconds
        self.peak_rss = peak_rss


@dataclass
class Part:
    file: BinaryIO  # an anonymous temporary file, at its start
    size: int
    sha256: str


@dataclass
class Read:
    summary: dict[str, Any]
    data: dict[str, Any] | None  # what a workflow trigger reads as `event` (reports.event_data)
    key: str
    matched: bool
    filter_note: str  # why it was filtered, or which filter could not judge it
    parts: dict[str, Part]
    seconds: float
    peak_rss: int  # the child's peak resident memory, bytes
    files: list[BinaryIO] = field(default_factory=list)

    def close(self) -> None:
        for file in self.files:
            file.close()


def read(body: BinaryIO, body_format: str, filters: Filters) -> Read:
    """The body (a file with a descriptor) read, summarised and filtered in a child process.
    Raises Failed when it cannot be; the caller closes the Read."""
    fd = body.fileno()  # a body from S3 is on local disk from here
    files = [tempfile.TemporaryFile() for _ in PARTS]
    try:
        outcome, seconds, peak_rss = _in_child(lambda: _read(fd, body_format, filters, files))
        if "failed" in outcome:
            raise Failed(outcome["failed"], outcome.get("detail", ""), seconds, peak_rss)
        parts = {}
        for (name, meta), file in zip(outcome["parts"].items(), files, strict=True):
            file.seek(0)
            parts[name] = Part(file, meta["size"], meta["sha256"])
        return Read(
            outcome["summary"],
            outcome["data"],
            outcome["key"],
            outcome["matched"],
            outcome["filter_note"],
            parts,
            seconds,
            peak_rss,
            files,
        )
    except BaseException:
        for file in files:
            file.close()
        raise


def _read(fd: int, body_format: str, filters: Filters, files: list[BinaryIO]) -> dict[str, Any]:
    """In the child: the outcome, as plain data."""
    with open(fd, "rb", closefd=False) as body:
        body.seek(0)
        data = body.read()
    budget = parsing.node_budget(len(data))
    if body_format == BodyFormat.YAML:
        document = parsing.read_yaml(data, budget)
    else:
        document = parsing.plain(parsing.load_json(data), budget)
    del data
    analysed = analyse(document)
    del document
    values = (analysed.report, logs_of(analysed.report), events_of(analysed.report))
    matched, filter_note = filters.verdict(analysed.summary, analysed.resources, analysed.carries_resources)
    return {
        "summary": parsing.without_nul(analysed.summary),
        "data": parsing.without_nul(analysed.data),
        "key": parsing.without_nul(analysed.key),
        "matched": matched,
        "filter_note": parsing.without_nul(filter_note),
        "parts": {name: _write(value, file) for name, value, file in zip(PARTS, values, files, strict=True)},
    }


def _write(value: Any, file: BinaryIO) -> dict[str, Any]:
    data = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    file.write(data)
    file.flush()  # os._exit flushes nothing
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _in_child(work: Any) -> tuple[dict[str, Any], float, int]:
    """Run work() in a forked child with the limits; (its outcome, seconds, peak RSS bytes)."""
    timeout = settings.EVENTS_READ_TIMEOUT
    memory = settings.EVENTS_READ_MEMORY_BYTES
    parent = os.getpid()
    readable, writable = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: it never returns into the worker's code
        try:
            os.close(readable)
            _child(work, writable, parent, memory, timeout)
        finally:
            os._exit(1)
    os.close(writable)
    message = bytearray()
    timed_out = ended = False
    try:
        with os.fdopen(readable, "rb", buffering=0) as pipe:
            waiting = select.poll()
            waiting.register(pipe, select.POLLIN)
            while not (timed_out or ended):
                remaining = started + timeout - time.monotonic()
                if remaining <= 0 or not waiting.poll(remaining * 1000):
                    timed_out = True
                    continue
                chunk = pipe.read(65536)
                message.extend(chunk)
                ended = not chunk
    finally:
        if not ended:  # timed out, or the worker itself is stopping
            _kill(pid)
        status, peak_rss = _reap(pid)
    seconds = time.monotonic() - started
    if timed_out or (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU):
        return (
            {"failed": f"Reading it took more than {timeout:g} s (EVENTS_READ_TIMEOUT); not read."},
            seconds,
            peak_rss,
        )
    try:
        return json.loads(message), seconds, peak_rss
    except ValueError:
        return {"failed": _died(status)}, seconds, peak_rss


def _child(work: Any, out: int, parent: int, memory: int, timeout: float) -> NoReturn:
    status = 0
    try:
        _confine(parent, memory, timeout)
        outcome = work()
    except parsing.UnreadableReport as exc:
        outcome = {"failed": str(exc)}
    except MemoryError:
        outcome = {"failed": f"Reading it takes more than {memory // 2**20} MB (EVENTS_READ_MEMORY_BYTES)."}
    except Exception as exc:
        # Anything else (a report of an unexpected shape, or a bug of ours): the same document
        # would fail the same way again, so the event ends failed and the worker goes on.
        outcome = {
            "failed": f"The report could not be read: {type(exc).__name__}: {exc}"[:1000],
            "detail": traceback.format_exc(),
        }
    try:
        with os.fdopen(out, "wb") as pipe:
            pipe.write(json.dumps(outcome).encode())
    except BaseException:
        status = 1
    os._exit(status)


def _confine(parent: int, memory: int, timeout: float) -> None:
    # The worker's handlers (Celery's warm and cold shutdown) are not the child's.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1):
        signal.signal(signum, signal.SIG_DFL)
    _die_with(parent)
    _lower(resource.RLIMIT_CORE, 0)  # a crash on a poison document leaves no core file to fill the disk
    _lower(resource.RLIMIT_CPU, math.ceil(timeout) + 1)  # SIGXCPU: also ends an orphan
    mapped = _address_space()
    if mapped:
        # Counted from what the worker has mapped already (the child shares it).
        _lower(resource.RLIMIT_AS, mapped + memory)
    # A short-lived process: the cyclic collector would only walk the document again and
    # again as it grows.
    gc.disable()


def _die_with(parent: int) -> None:
    """Linux ends the child when the worker dies (killed mid-read): no orphan reads on."""
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: RLIMIT_CPU ends it
    if os.getppid() != parent:  # the worker died before prctl
        os._exit(1)


def _lower(limit: int, value: int) -> None:
    _, hard = resource.getrlimit(limit)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(limit, (value, value))


def _address_space() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> tuple[int, int]:
    """(wait status, peak RSS in bytes) of the child."""
    try:
        _, status, usage = os.wait4(pid, 0)
    except ChildProcessError:  # reaped by someone else's SIGCHLD handler
        return 0, 0
    return status, usage.ru_maxrss * 1024


def _died(status: int) -> str:
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        if name == "SIGKILL":
            return "The reader was killed (SIGKILL: the kernel's out-of-memory killer?); not read."
        return f"The reader crashed on it ({name}); not read."
    return f"The reader ended without an answer (exit status {os.waitstatus_to_exitcode(status)}); not read."
