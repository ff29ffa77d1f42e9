"""Event bodies and parts in an S3-compatible store through django-storages. S3 itself cannot
be installed here: moto's server, which speaks the S3 API over HTTP, stands in for it."""

import hashlib
import json

import boto3
import pytest
from moto.server import ThreadedMotoServer

from tests.bao import free_port
from tests.conftest import client_for
from tests.events_helpers import fixture, post
from triggers import services
from triggers.ingest import body_name
from triggers.models import Event, ReleasedObject, Trigger
from triggers.tasks import delete_released_objects

REPORT = fixture("puppet-8.4-jacobbrewer1-puppet-summary-example.yaml")


@pytest.fixture
def moto_server():
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3(settings, monkeypatch, moto_server):
    host, port = moto_server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for name, value in {"AWS_ACCESS_KEY_ID": "relay", "AWS_SECRET_ACCESS_KEY": "relay-secret"}.items():
        monkeypatch.setenv(name, value)
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket="relay-events")
    # What EVENTS_STORAGE=s3 and its variables configure (relay/settings.py).
    settings.STORAGES = {
        **settings.STORAGES,
        "events": {
            "BACKEND": "storages.backends.s3.S3Storage",
            "OPTIONS": {
                "bucket_name": "relay-events",
                "endpoint_url": endpoint,
                "region_name": "us-east-1",
                "access_key": "relay",
                "secret_key": "relay-secret",
                "location": "relay-events",
                "file_overwrite": True,
                "default_acl": None,
            },
        },
    }
    client.server = moto_server
    return client


def test_bodies_and_parts_go_to_s3_and_come_back_as_streams(alice, alice_api, s3):
    trigger, token = Trigger.create_with_token(owner=alice, name="t")
    event_id = post(str(token), REPORT).json()["id"]
    key = f"relay-events/{body_name(hashlib.sha256(REPORT).hexdigest())}"
    assert s3.get_object(Bucket="relay-events", Key=key)["Body"].read() == REPORT

    services.process(event_id)
    detail = alice_api.get(f"/api/triggers/{trigger.pk}/events/{event_id}/").json()
    assert detail["state"] == "matched"
    stored = {o["Key"] for o in s3.list_objects_v2(Bucket="relay-events")["Contents"]}
    assert {
        f"relay-events/parts/{p['sha256'][:2]}/{p['sha256'][2:4]}/{p['sha256']}.json"
        for name, p in detail["parts"].items()
        if name != "body"
    } <= stored
    report = alice_api.get(detail["parts"]["report"]["url"])
    assert json.loads(b"".join(report.streaming_content))["host"] == "example-host"
    body = client_for(alice).get(detail["parts"]["body"]["url"])
    assert b"".join(body.streaming_content) == REPORT


def stored_keys(s3) -> set[str]:
    return {o["Key"] for o in s3.list_objects_v2(Bucket="relay-events").get("Contents", [])}


def event_keys(alice_api, trigger, event_id) -> set[str]:
    detail = alice_api.get(f"/api/triggers/{trigger.pk}/events/{event_id}/").json()
    return {
        f"relay-events/{body_name(p['sha256'])}"
        if name == "body"
        else f"relay-events/parts/{p['sha256'][:2]}/{p['sha256'][2:4]}/{p['sha256']}.json"
        for name, p in detail["parts"].items()
    }


@pytest.mark.django_db(transaction=True)
def test_deleting_events_deletes_their_objects_in_s3_once_unshared(alice, alice_api, s3):
    first, first_token = Trigger.create_with_token(owner=alice, name="first")
    second, second_token = Trigger.create_with_token(owner=alice, name="second")
    first_id = post(str(first_token), REPORT).json()["id"]
    second_id = post(str(second_token), REPORT).json()["id"]  # the same body, to another trigger
    services.process(first_id)
    services.process(second_id)
    keys = event_keys(alice_api, first, first_id)
    assert len(keys) == 4 and keys == stored_keys(s3)

    assert alice_api.delete(f"/api/triggers/{first.pk}/events/{first_id}/").status_code == 204
    assert stored_keys(s3) == keys
    assert alice_api.delete(f"/api/triggers/{second.pk}/").status_code == 204
    assert stored_keys(s3) == set()


@pytest.mark.django_db(transaction=True)
def test_a_delete_while_s3_is_down_is_done_and_the_sweep_deletes_the_objects_later(
    alice, alice_api, s3, moto_server
):
    trigger, token = Trigger.create_with_token(owner=alice, name="t")
    event_id = post(str(token), REPORT).json()["id"]
    services.process(event_id)
    keys = event_keys(alice_api, trigger, event_id)

    moto_server.stop()  # the store is unreachable
    response = alice_api.delete(f"/api/triggers/{trigger.pk}/events/{event_id}/")
    assert response.status_code == 204
    assert not Event.objects.filter(pk=event_id).exists()
    assert ReleasedObject.objects.count() == 4
    assert delete_released_objects() == 0  # still down: nothing lost, nothing raised

    moto_server.start()  # back, with what it held
    assert stored_keys(s3) == keys
    assert delete_released_objects() == 4
    assert stored_keys(s3) == set()
    assert ReleasedObject.objects.count() == 0


def test_an_s3_outage_is_retried_not_a_failed_event(alice, s3):
    _, token = Trigger.create_with_token(owner=alice, name="t")
    event_id = post(str(token), REPORT).json()["id"]
    s3.server.stop()  # S3 is down when the worker reads the body
    with pytest.raises(services.StorageUnavailable):
        services.process(event_id)
    event = Event.objects.get(pk=event_id)
    assert (event.state, event.attempts) == ("received", 0)  # not read: no attempt counted
    assert event.failure_reason.startswith("The events storage could not read the body (")
    s3.server.start()
    services.process(event_id)
    assert Event.objects.get(pk=event_id).state == "matched"
