"""`relay-puppet-run` (bridge_client) against a live server of the project. A test plays the
bridge between the step's polls; the step's clock is a fake one that the test moves."""

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from relay_bridge.api import RelayClient
from relay_bridge.step import Clock, main

from puppet_connection.models import PuppetConnection
from runs.models import Run
from tests.bridge_helpers import wait_for

STEP = str(Path(sys.executable).parent / "relay-puppet-run")
pytestmark = pytest.mark.django_db(transaction=True)


class FakeClock(Clock):
    """now() starts at the real time and moves only when the step sleeps; each sleep first
    runs the next of the test's bridge actions."""

    def __init__(self, actions: list) -> None:
        self.moment = datetime.now(UTC)
        self.actions = list(actions)
        super().__init__(now=lambda: self.moment, sleep=self._sleep)

    def _sleep(self, seconds: float) -> None:
        if self.actions:
            self.actions.pop(0)()
        self.moment += timedelta(seconds=seconds)


@pytest.fixture
def service(live_server, monkeypatch):
    owner = User.objects.create_user("ops")
    _, token = PuppetConnection.create_with_token(owner=owner, name="prod")
    bridge = RelayClient(live_server.url, str(token), platform="oss", backend="ssh", attempts=1)
    monkeypatch.delenv("RELAY_CONNECTION_TOKEN_FILE", raising=False)
    monkeypatch.setenv("RELAY_CONNECTION_TOKEN", str(token))  # never on the command line
    yield live_server.url, str(token), bridge
    bridge.close()


def step(service, clock, *args):
    url, _, _ = service
    return main(["--api-url", url, "--poll-interval", "5", *args], clock=clock)


def the_run() -> Run:
    return Run.objects.get()


def test_a_finished_run_prints_its_outputs_and_exits_0(service, tmp_path, capsys):
    _, _, bridge = service

    def accept_and_start():
        lease = bridge.accept(str(the_run().id))
        due = (datetime.now(UTC) + timedelta(seconds=45)).isoformat()
        bridge.put_state(
            str(the_run().id), {"status": "in-progress", "job_id": "81", "next_update_before": due}, lease
        )

    def finish():
        bridge.put_state(
            str(the_run().id),
            {
                "status": "complete",
                "outcome": "finished",
                "job_id": "81",
                "run_results": {"node-a": {"exit_code": 2}},
            },
        )

    outputs = tmp_path / "outputs.json"
    code = step(
        service,
        FakeClock([accept_and_start, finish]),
        "--nodes",
        "node-a,node-b",
        "--environment",
        "production",
        "--noop",
        "--outputs-file",
        str(outputs),
    )
    assert code == 0
    assert json.loads(capsys.readouterr().out) == {"jobID": "81", "outcome": "finished"}
    assert json.loads(outputs.read_text()) == {"jobID": "81", "outcome": "finished"}
    run = the_run()
    assert (
        run.scope == {"nodes": ["node-a", "node-b"]} and run.environment == "production" and run.noop is True
    )


def test_a_failed_run_exits_1(service, capsys):
    _, _, bridge = service

    def fail():
        bridge.accept(str(the_run().id))
        bridge.put_state(str(the_run().id), {"status": "complete", "outcome": "failed"})

    assert step(service, FakeClock([fail]), "--nodes", "node-a") == 1
    assert json.loads(capsys.readouterr().out)["outcome"] == "failed"


def test_missed_heartbeats_time_the_step_out_and_cancel_the_run(service, capsys):
    _, _, bridge = service
    seen: dict = {}

    def start():
        seen["lease"] = bridge.accept(str(the_run().id))
        due = (datetime.now(UTC) + timedelta(seconds=45)).isoformat()
        seen["state"] = bridge.put_state(
            str(the_run().id), {"status": "in-progress", "next_update_before": due}
        )

    # Then the bridge goes silent: no more actions. The step polls every 5 (fake) seconds.
    clock = FakeClock([start])
    assert step(service, clock, "--nodes", "node-a") == 1
    assert json.loads(capsys.readouterr().out) == {"jobID": "", "outcome": "timed-out"}
    updated = datetime.fromisoformat(seen["state"]["updated_at"].replace("Z", "+00:00"))
    due = datetime.fromisoformat(seen["state"]["next_update_before"].replace("Z", "+00:00"))
    # It gave up at the first poll after updated_at + 3 x (next_update_before - updated_at), not before.
    deadline = updated + 3 * (due - updated)
    assert deadline < clock.moment <= deadline + timedelta(seconds=5)
    assert the_run().cancel_requested is True


def test_a_run_nobody_accepts_times_out_after_the_accept_timeout(service, capsys):
    clock = FakeClock([])
    assert step(service, clock, "--nodes", "node-a", "--accept-timeout", "60") == 1
    assert json.loads(capsys.readouterr().out)["outcome"] == "timed-out"
    assert the_run().outcome == "cancelled"  # the step cancelled it: no bridge picks it up later


def test_the_rfc_spec_file_with_its_field_names(service, tmp_path):
    _, _, bridge = service
    (tmp_path / "spec.yaml").write_text(
        # The RFC's step spec (Relay resolves `!Connection`; the step is given the URL and token).
        "connection: {type: puppet, name: prod}\n"
        "timeoutAfterMissedHeartbeats: 3\nenvironment: staging\nscope:\n  nodes:\n  - node-a.example.com\n"
        "noOp: true\ndebug: true\ntrace: false\nevalTrace: true\n"
    )

    def finish():
        bridge.accept(str(the_run().id))
        bridge.put_state(str(the_run().id), {"status": "complete"})

    assert step(service, FakeClock([finish]), "--spec", str(tmp_path / "spec.yaml")) == 0
    run = the_run()
    assert (run.environment, run.noop, run.debug, run.trace, run.evaltrace) == (
        "staging",
        True,
        True,
        False,
        True,
    )
    assert run.scope == {"nodes": ["node-a.example.com"]}


@pytest.mark.parametrize(
    "args",
    [
        ["--nodes", "node-a", "--timeout-after-missed-heartbeats", "0"],
        ["--spec", "/no/such/spec.yaml"],
        ["--params", "{not json", "--type", "task-run", "--name", "x", "--targets", "a"],
    ],
)
def test_a_bad_spec_exits_2_and_creates_nothing(service, args):
    assert step(service, FakeClock([]), *args) == 2
    assert not Run.objects.exists()


def test_the_service_refusing_the_run_exits_3(service, capsys):
    assert step(service, FakeClock([]), "--nodes", "Not A Certname") == 3
    assert "400" in capsys.readouterr().err


def test_missing_url_or_token_exits_2(monkeypatch):
    monkeypatch.delenv("RELAY_API_URL", raising=False)
    monkeypatch.delenv("RELAY_CONNECTION_TOKEN", raising=False)
    assert main(["--nodes", "a"]) == 2


def test_the_bridge_s_platform_reaches_the_connection(service):
    _, _, bridge = service
    bridge.list_runs()
    connection = PuppetConnection.objects.get()
    assert (connection.reported_platform, connection.reported_backend) == ("oss", "ssh")


def test_the_token_is_not_in_the_step_s_command_line(service, tmp_path):
    """`ps` shows every user each process's argv: the step's token comes from its environment."""
    url, token, bridge = service
    waiting = subprocess.Popen(
        [STEP, "--api-url", url, "--nodes", "node-a", "--poll-interval", "0.2", "--accept-timeout", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        run = wait_for(lambda: Run.objects.first(), 30, "the step to create its run")
        argv = Path(f"/proc/{waiting.pid}/cmdline").read_bytes()
        assert b"--nodes\0node-a" in argv  # it is the step's
        assert token.encode() not in argv
        bridge.accept(str(run.id))
        bridge.put_state(str(run.id), {"status": "complete", "outcome": "finished"})
        out, err = waiting.communicate(timeout=30)
    finally:
        waiting.kill()
    assert waiting.returncode == 0, err
    assert json.loads(out)["outcome"] == "finished"


def test_a_token_on_the_command_line_is_refused_saying_how_to_give_it(service, capsys):
    url, token, _ = service
    assert main(["--api-url", url, "--token", token, "--nodes", "node-a"]) == 2
    err = capsys.readouterr().err
    assert "RELAY_CONNECTION_TOKEN" in err and "--token-file" in err
    assert token not in err
    assert not Run.objects.exists()


@pytest.mark.parametrize("source", ["file", "spec"])
def test_the_token_comes_from_a_file_or_the_spec_s_resolved_connection(
    service, tmp_path, monkeypatch, source
):
    """A `!Connection {type: puppet}` resolves to `{relayAPIURL, token}` in the step's spec."""
    url, token, bridge = service
    monkeypatch.delenv("RELAY_CONNECTION_TOKEN")
    spec = tmp_path / "spec.json"
    args = ["--spec", str(spec)]
    if source == "file":
        (tmp_path / "token").write_text(token + "\n")
        spec.write_text(json.dumps({"nodes": ["node-a"]}))
        args += ["--api-url", url, "--token-file", str(tmp_path / "token")]
    else:
        spec.write_text(json.dumps({"nodes": ["node-a"], "connection": {"relayAPIURL": url, "token": token}}))

    def finish():
        bridge.accept(str(the_run().id))
        bridge.put_state(str(the_run().id), {"status": "complete", "outcome": "finished"})

    assert main([*args, "--poll-interval", "5"], clock=FakeClock([finish])) == 0
    assert the_run().scope == {"nodes": ["node-a"]}
