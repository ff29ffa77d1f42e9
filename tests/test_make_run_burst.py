"""`make run`'s embedded default (SQLite, its own workers) takes a burst: 100 runs of a
workflow with a script step and an approval, started at once and all approved, all succeed,
and no "database is locked" reaches a user or a log as an error: with Redis, and without (the
filesystem queue make run falls back to). The figures it prints are in README "make run"."""

import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing

import pytest
import requests

from tests.bao import free_port
from tests.test_make_run import Service, free_port_pair

RUNS = 100
SOURCE = """apiVersion: v1
steps:
- name: script
  image: relaysh/core
  input:
  - echo "hello from $(hostname)"
  - for i in 1 2 3 4 5; do echo "line $i"; sleep 0.2; done
  - ni output set --key said --value hello
- name: approve
  type: approval
  dependsOn: script
"""


def whole(session: requests.Session, url: str) -> dict:
    response = session.get(url, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def all_runs(session: requests.Session, base: str) -> list[dict]:
    runs: list[dict] = []
    url = f"{base}/api/workflow-runs/?workflow=burst&limit=100"
    while url:
        page = whole(session, url)
        runs += page["results"]
        url = page["next"]
    return runs


@pytest.mark.django_db(False)
@pytest.mark.parametrize("broker", ["redis", "filesystem"])
def test_a_burst_of_script_and_approval_runs_all_succeed_on_the_embedded_default(tmp_path, broker):
    ports = {"PORT": str(free_port()), "VAULT_PORT": str(free_port_pair())}
    # Without Redis, make run's workers share a filesystem queue under var/.
    no_redis = {"REDIS_URL": "redis://127.0.0.1:1/0"} if broker == "filesystem" else {}
    service = Service(tmp_path / "var", **ports, **no_redis)
    try:
        service.wait_for_line("Relay is up")
        assert ("filesystem queue" in "".join(service.output)) == (broker == "filesystem")
        service.manage(
            "shell",
            "-c",
            "from django.contrib.auth.models import User;"
            "User.objects.create_superuser('ops', 'ops@example.com', 'x')",
        )
        key = service.manage("create_user_token", "ops").strip().splitlines()[-1]
        base = service.url("")
        session = requests.Session()
        session.headers["Authorization"] = f"Token {key}"
        created = session.post(f"{base}/api/workflows/", json={"name": "burst", "source": SOURCE}, timeout=30)
        assert created.status_code == 201, created.text

        def start(_: int) -> requests.Response:
            with requests.Session() as own:
                own.headers["Authorization"] = f"Token {key}"
                return own.post(f"{base}/api/workflows/burst/runs/", json={"parameters": {}}, timeout=120)

        first = time.monotonic()
        with ThreadPoolExecutor(RUNS) as pool:
            answers = list(pool.map(start, range(RUNS)))
        assert [a.status_code for a in answers] == [201] * RUNS, [
            a.text for a in answers if a.status_code != 201
        ]
        ids = {a.json()["id"] for a in answers}
        posted = time.monotonic()

        # Approve each run as soon as its approval waits, all of them at once.
        approved: set[str] = set()
        deadline = time.monotonic() + 180
        while len(approved) < RUNS and time.monotonic() < deadline:
            waiting = [
                run["id"]
                for run in all_runs(session, base)
                if run["id"] in ids - approved
                and any(s["name"] == "approve" and s["status"] == "in-progress" for s in run["steps"])
            ]

            def approve(run_id: str) -> requests.Response:
                with requests.Session() as own:
                    own.headers["Authorization"] = f"Token {key}"
                    return own.post(f"{base}/api/workflow-runs/{run_id}/steps/approve/approve/", timeout=120)

            with ThreadPoolExecutor(max(len(waiting), 1)) as pool:
                for run_id, answer in zip(waiting, pool.map(approve, waiting), strict=True):
                    assert answer.status_code == 200, answer.text
                    approved.add(run_id)
            ended = [r for r in all_runs(session, base) if r["status"] == "complete"]
            assert all(r["outcome"] == "success" for r in ended), [
                (s["name"], s["status"], s["message"])
                for r in ended
                for s in r["steps"]
                if s["status"] != "success"
            ]
            time.sleep(1)
        assert len(approved) == RUNS, f"{len(approved)} approvals waited in time"

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            runs = [r for r in all_runs(session, base) if r["id"] in ids]
            if all(r["status"] == "complete" for r in runs):
                break
            time.sleep(1)
        done = time.monotonic() - posted
        unfinished = [
            (r["status"], [(s["name"], s["status"]) for s in r["steps"]])
            for r in runs
            if r["status"] != "complete"
        ]
        assert not unfinished, unfinished
        failed = [
            (r["outcome"], [(s["name"], s["status"], s["message"]) for s in r["steps"]])
            for r in runs
            if r["outcome"] != "success"
        ]
        assert not failed, failed
        # Every script ran to its end, its whole log stored.
        for run_id in ids:
            log = whole(session, f"{base}/api/workflow-runs/{run_id}/steps/script/log")
            assert log["text"] == (
                "hello from relay-step\nline 1\nline 2\nline 3\nline 4\nline 5\n"
                'Successfully set output for "said".\n'
            ), log
        print(
            f"\n{broker}: {RUNS} runs posted at once in {posted - first:.1f} s, all complete {done:.1f} s on"
        )
        # Readers and the writer go on together (README "Configuration").
        with closing(sqlite3.connect(tmp_path / "var" / "relay.sqlite3")) as db:
            assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        code = service.interrupt()
        (tmp_path / "service.log").write_text("".join(service.output))
        assert code == 0
    output = "".join(service.output)
    assert "locked" not in output.lower(), [line for line in service.output if "locked" in line.lower()][:20]
    # Every run's first task reached the broker at once (none left for the sweeper).
    assert "could not queue" not in output, [line for line in service.output if "could not queue" in line][:5]
    assert " ERROR " not in output and "Traceback" not in output, [
        line for line in service.output if " ERROR " in line or "Traceback" in line
    ][:20]
