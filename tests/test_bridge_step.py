"""`relay-puppet-run` (bridge_client) against a live server of the project. A test plays the
bridge between the step's polls; the step's clock is a fake one that the test moves."""

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from relay_bridge.api import RelayClient
from relay_bridge.step import Clock, main

from puppet_connection.models import PuppetConnection
from runs.models import Run

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
def service(live_server):
    owner = User.objects.create_user("ops")
    _, token = PuppetConnection.create_with_token(owner=owner, name="prod")
    bridge = RelayClient(live_server.url, str(token), platform="oss", backend="ssh", attempts=1)
    yield live_server.url, str(token), bridge
    bridge.close()


def step(service, clock, *args):
    url, token, _ = service
    return main(["--api-url", url, "--token", token, "--poll-interval", "5", *args], clock=clock)


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
    assert (connection.platform, connection.bridge_backend) == ("oss", "ssh")
