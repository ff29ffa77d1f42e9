"""CPU seconds the service spends, read from /proc: a figure the machine's load does not
change much, where latency and rate depend on who else is running.

The benchmarks print CPU milliseconds per request for each part: the web processes
(gunicorn's master and workers), PostgreSQL (the backends connected to the benchmark's
database; the cluster's WAL writer and checkpointer are shared with other databases and not
counted), and the load generator (this process). On these VMs the hardware counters
(`perf stat -e instructions`) are not available, so CPU time is the load-independent
measure; it still grows a little on a loaded machine (caches and the hypervisor's steal).
"""

import os
from dataclasses import dataclass
from pathlib import Path

import psycopg

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of a process (all its threads), 0 if it has gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def family(master: int) -> list[int]:
    """gunicorn's master and its workers."""
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    return [master, *(int(pid) for pid in children)]


@dataclass
class Sample:
    web: float
    postgres: float
    generator: float


class CpuMeter:
    def __init__(self, master: int, database: str) -> None:
        self.master, self.database = master, database
        self.admin = psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True)

    def _backends(self) -> list[int]:
        rows = self.admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (self.database,),
        ).fetchall()
        return [pid for (pid,) in rows]

    def sample(self) -> Sample:
        return Sample(
            web=sum(cpu_seconds(pid) for pid in family(self.master)),
            postgres=sum(cpu_seconds(pid) for pid in self._backends()),
            generator=cpu_seconds(os.getpid()),
        )

    def close(self) -> None:
        self.admin.close()


def per_request(before: Sample, after: Sample, requests: int) -> str:
    """'web 0.41 + PostgreSQL 0.22 (+ generator 0.12) CPU ms per request'."""

    def ms(a: float, b: float) -> float:
        return (b - a) * 1000 / max(requests, 1)

    web, postgres = ms(before.web, after.web), ms(before.postgres, after.postgres)
    generator = ms(before.generator, after.generator)
    return f"CPU per request: web {web:.2f} ms + PostgreSQL {postgres:.2f} ms (generator {generator:.2f} ms)"


def load_average() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[0]
