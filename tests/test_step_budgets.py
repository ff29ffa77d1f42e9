"""A step's budgets at the step runtime API (docs/security.md "Budgets"), on a live server with the
step's real credential: its outputs together, its runtime logs, its events and decorators.
Sizes are 413 problems, counts 429, and nothing is stored past a budget, also when requests
come at once."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from relay_sdk import Interface

from stepruntime.models import EmittedEvent, StepLog, StepLogMessage
from tests.runtime_helpers import Running, later_step_outputs, start_step
from tests.workflow_helpers import make_workflow
from workflows import engine
from workflows.models import StepRun

SOURCE = """
apiVersion: v1
steps:
- name: a
  image: relaysh/core:latest-python
- name: b
  image: relay-internal/noop
  spec:
    outputs:
      small: !Output [a, small]
  dependsOn: a
"""
MIB = 1024 * 1024


@pytest.fixture
def held(transactional_db, alice, live_server) -> Running:
    run = engine.create_run(make_workflow(alice, SOURCE), {}, created_by=alice)
    return start_step(run, "a", base=live_server.url)


def call(held: Running, method: str, path: str, body: bytes, content_type: str) -> requests.Response:
    return requests.request(
        method, held.url + path, data=body, headers={"Content-Type": content_type}, timeout=60
    )


def assert_problem(response: requests.Response, status: int, *words: str) -> None:
    assert response.status_code == status, response.text[:500]
    assert response.headers["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status and body["type"] == "urn:relay:problem:step_budget_exceeded"
    for word in words:
        assert word in body["detail"]


def stored_output_bytes(held: Running) -> int:
    outputs = StepRun.objects.values_list("outputs", flat=True).get(pk=held.step.pk)
    return len(json.dumps(outputs).encode())


def test_outputs_past_the_step_budget_are_refused_with_413(held):
    relay = Interface(api_url=held.url)
    big = "x" * (19 * MIB // 10)  # 1.9 MB, under the 2 MiB body limit
    relay.outputs.set("one", big)
    relay.outputs.set("two", big)
    with pytest.raises(requests.HTTPError) as caught:
        relay.outputs.set("three", big)
    assert_problem(caught.value.response, 413, "4194304 bytes", "STEP_OUTPUTS_MAX_BYTES", "'three'")
    outputs = StepRun.objects.get(pk=held.step.pk).outputs
    assert set(outputs) == {"one", "two"}
    assert stored_output_bytes(held) <= 4 * MIB

    # The budget is on what the step keeps, not on what it sent: replacing an output with a
    # smaller one frees room, and the run goes on with what was stored.
    relay.outputs.set("two", "short")
    relay.outputs.set("small", "fits")
    held.end()
    assert later_step_outputs(held.run, "b") == {"small": "fits"}


def test_outputs_put_at_once_never_pass_the_budget_together(held, settings):
    settings.STEP_OUTPUTS_MAX_BYTES = 2 * MIB
    value = json.dumps("y" * (MIB // 2)).encode()  # 512 KiB each: at most three fit in 2 MiB

    def put(index: int) -> int:
        return call(held, "PUT", f"/outputs/o{index}", value, "application/json").status_code

    with ThreadPoolExecutor(12) as pool:
        codes = list(pool.map(put, range(12)))
    assert sorted(set(codes)) == [201, 413], codes
    assert codes.count(201) == 3
    assert len(StepRun.objects.get(pk=held.step.pk).outputs) == 3
    assert stored_output_bytes(held) <= 2 * MIB


def test_runtime_logs_are_bounded_per_step_in_records_and_bytes(held, settings):
    settings.STEP_LOG_MAX_RECORDS = 5
    settings.STEP_LOG_MAX_BYTES = 100_000
    octets = "application/octet-stream"
    # Records: a log opened counts, and so does each message, whichever log it is in (a new
    # log is no new budget).
    first = call(held, "POST", "/logs", b"header", octets)
    assert first.status_code == 201
    for _ in range(3):
        assert call(held, "POST", f"/logs/{first.text}/messages", b"line", octets).status_code == 202
    second = call(held, "POST", "/logs", b"header", octets)
    assert second.status_code == 201
    assert_problem(
        call(held, "POST", f"/logs/{second.text}/messages", b"line", octets), 429, "5", "STEP_LOG_MAX_RECORDS"
    )
    assert_problem(call(held, "POST", "/logs", b"header", octets), 429, "STEP_LOG_MAX_RECORDS")
    assert StepLog.objects.filter(step_run=held.step).count() == 2
    assert StepLogMessage.objects.filter(log__step_run=held.step).count() == 3


def test_runtime_log_bytes_are_bounded_per_step(held, settings):
    settings.STEP_LOG_MAX_BYTES = 150_000
    octets = "application/octet-stream"
    log_id = call(held, "POST", "/logs", b"h", octets).text
    chunk = b"z" * 60_000
    assert call(held, "POST", f"/logs/{log_id}/messages", chunk, octets).status_code == 202
    assert call(held, "POST", f"/logs/{log_id}/messages", chunk, octets).status_code == 202
    assert_problem(call(held, "POST", f"/logs/{log_id}/messages", chunk, octets), 413, "STEP_LOG_MAX_BYTES")
    # What still fits is taken.
    assert call(held, "POST", f"/logs/{log_id}/messages", b"z" * 20_000, octets).status_code == 202
    stored = sum(len(bytes(m)) for m in StepLogMessage.objects.values_list("body", flat=True))
    assert stored == 140_000


def test_runtime_log_records_sent_at_once_never_pass_the_budget(held, settings):
    settings.STEP_LOG_MAX_RECORDS = 20
    octets = "application/octet-stream"
    log_id = call(held, "POST", "/logs", b"h", octets).text

    def send(_: int) -> int:
        return call(held, "POST", f"/logs/{log_id}/messages", b"line", octets).status_code

    with ThreadPoolExecutor(10) as pool:
        codes = list(pool.map(send, range(40)))
    assert codes.count(202) == 19 and codes.count(429) == 21
    assert StepLogMessage.objects.filter(log_id=log_id).count() == 19


def test_events_are_bounded_per_step_in_count_and_bytes(held, settings):
    settings.STEP_EVENTS_MAX = 3
    relay = Interface(api_url=held.url)
    for index in range(3):
        relay.events.emit({"n": index}, key=f"k{index}")
    with pytest.raises(requests.HTTPError) as caught:
        relay.events.emit({"n": 3}, key="k3")
    assert_problem(caught.value.response, 429, "3 events", "STEP_EVENTS_MAX")
    assert sorted(EmittedEvent.objects.values_list("key", flat=True)) == ["k0", "k1", "k2"]

    settings.STEP_EVENTS_MAX = 100
    settings.STEP_EVENTS_MAX_BYTES = 1_000_000
    big = {"blob": "e" * 600_000}
    relay.events.emit(big, key="big")
    with pytest.raises(requests.HTTPError) as caught:
        relay.events.emit(big, key="too-big")
    assert_problem(caught.value.response, 413, "1000000 bytes", "STEP_EVENTS_MAX_BYTES")
    assert EmittedEvent.objects.filter(step_run=held.step).count() == 4


def test_decorators_are_bounded_per_step(held, settings):
    settings.STEP_DECORATORS_MAX_BYTES = 4096
    relay = Interface(api_url=held.url)
    relay.decorators.set_link("pr", "The pull request", "https://example.com/pr/7")
    with pytest.raises(requests.HTTPError) as caught:
        relay.decorators.set_link("long", "d" * 5000, "https://example.com/")
    assert_problem(caught.value.response, 413, "STEP_DECORATORS_MAX_BYTES")
    assert set(StepRun.objects.get(pk=held.step.pk).decorators) == {"pr"}


def test_what_a_step_says_of_its_outputs_is_bounded_too(held, settings):
    """A step may mark any name sensitive, set or not: without a budget, the metadata of a
    million names would be kept."""
    settings.STEP_OUTPUT_METADATA_MAX_BYTES = 4096
    body = json.dumps({"sensitive": True}).encode()
    answers = [
        call(held, "PUT", f"/outputs/name-{i:04}/metadata", body, "application/json") for i in range(200)
    ]
    kept = [a for a in answers if a.status_code == 201]
    assert 0 < len(kept) < 200
    assert_problem(answers[-1], 413, "4096 bytes", "STEP_OUTPUT_METADATA_MAX_BYTES")
    metadata = StepRun.objects.values_list("output_metadata", flat=True).get(pk=held.step.pk)
    assert len(metadata) == len(kept)
    assert len(json.dumps(metadata).encode()) <= 4096
