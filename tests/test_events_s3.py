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
from triggers.models import Event, Trigger

REPORT = fixture("puppet-8.4-jacobbrewer1-puppet-summary-example.yaml")


@pytest.fixture
def s3(settings, monkeypatch):
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
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
    client.server = server
    yield client
    server.stop()


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
