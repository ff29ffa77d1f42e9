"""The filesystem queue (`make run` without Redis, relay/fsqueue.py): publishers and consumers
in separate processes racing on one folder deliver every message exactly once, and nothing
they do to each other stops a consumer."""

import multiprocessing
import os
import queue
import time
from pathlib import Path

import pytest
from kombu import Connection, Exchange, Queue

TRANSPORT = "relay.fsqueue:Transport"
PUBLISHERS, CONSUMERS, EACH = 4, 4, 300


def connection(folder: Path, transport: str) -> Connection:
    return Connection(
        "filesystem://",
        transport=transport,
        transport_options={
            "data_folder_in": str(folder),
            "data_folder_out": str(folder),
            "control_folder": str(folder / "control"),
            "polling_interval": 0.01,
        },
    )


def target(folder: Path) -> tuple[Exchange, Queue]:
    exchange = Exchange("work", type="direct")
    return exchange, Queue("work", exchange, routing_key="work")


def publish(folder: Path, transport: str, number: int) -> None:
    exchange, work = target(folder)
    with connection(folder, transport) as conn:
        # Every publisher declares, as every web process does at its first publish.
        producer = conn.Producer(exchange=exchange)
        for i in range(EACH):
            producer.publish({"n": number * EACH + i}, routing_key="work", declare=[work])


def consume(folder: Path, transport: str, out: multiprocessing.Queue) -> None:
    _, work = target(folder)
    got: list[int] = []
    with connection(folder, transport) as conn:
        channel = conn.channel()
        bound = work(channel)
        idle = 0
        while idle < 100:  # a second with nothing left
            message = bound.get(no_ack=True)
            if message is None:
                idle += 1
                time.sleep(0.01)
                continue
            idle = 0
            got.append(message.payload["n"])
    out.put(got)


@pytest.mark.django_db(False)
def test_racing_publishers_and_consumers_deliver_every_message_once(tmp_path):
    folder = tmp_path / "queue"
    folder.mkdir()
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = ctx.Queue()
    consumers = [ctx.Process(target=consume, args=(folder, TRANSPORT, out)) for _ in range(CONSUMERS)]
    publishers = [ctx.Process(target=publish, args=(folder, TRANSPORT, n)) for n in range(PUBLISHERS)]
    for process in consumers + publishers:
        process.start()
    for process in publishers:
        process.join(60)
        assert process.exitcode == 0
    received: list[int] = []
    for _ in consumers:
        try:
            received += out.get(timeout=60)
        except queue.Empty:
            pytest.fail("a consumer stopped without reporting (it crashed on a message)")
    for process in consumers:
        process.join(10)
        assert process.exitcode == 0
    assert sorted(received) == list(range(PUBLISHERS * EACH))
    assert not [name for name in os.listdir(folder) if name != "control"]
