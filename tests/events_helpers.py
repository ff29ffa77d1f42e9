import base64
import gzip
from pathlib import Path

from django.test import Client

FIXTURES = Path(__file__).resolve().parent.parent.parent / "shared" / "fixtures" / "public-reports"
EVENTS = "/api/events"


def post(token: str, body: bytes, content_type: str = "application/x-yaml", basic: bool = True, **extra):
    auth = "Basic " + base64.b64encode(f"any:{token}".encode()).decode() if basic else f"Bearer {token}"
    return Client().generic(
        "POST",
        EVENTS,
        body,
        content_type=content_type,
        HTTP_AUTHORIZATION=auth,
        HTTP_HOST="127.0.0.1",
        **extra,
    )


def gz(data: bytes) -> bytes:
    return gzip.compress(data)


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()
