"""relay.dispatch.publish in a new web process: the first burst of requests, each queueing
from a thread of its own before any tasks module was imported, all get their tasks queued."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.settings import outside_env

ROOT = Path(__file__).resolve().parent.parent

BURST = """
import threading, django
django.setup()
from relay import dispatch
failed = []
def queue(i):
    try:
        dispatch.publish("workflows.tasks.start_run", f"00000000-0000-0000-0000-{i:012d}")
    except Exception as exc:
        failed.append(repr(exc))
threads = [threading.Thread(target=queue, args=(i,)) for i in range(100)]
for t in threads: t.start()
for t in threads: t.join()
print(len(failed), failed[:1])
"""


@pytest.mark.django_db(False)
def test_a_burst_of_first_publishes_from_threads_queues_every_task():
    env = outside_env(
        DJANGO_SETTINGS_MODULE="relay.settings",
        SECRET_KEY="not-secret-in-tests",
        TOKEN_PEPPERS="1=" + "p" * 40,
        CELERY_BROKER_URL="memory://",  # one process: publishing is all that is asked
        PYTHONPATH=str(ROOT),
    )
    result = subprocess.run(
        [sys.executable, "-c", BURST], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0 []"
