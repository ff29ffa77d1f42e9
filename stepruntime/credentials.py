"""Handing a step its METADATA_API_URL.

The handler that starts a script step calls `grant(step_run_id)` and puts the URL into the
step's environment. This module imports only models and settings (never workflows.engine:
the engine imports the handlers that import this).
"""

from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.views.decorators.debug import sensitive_variables

from stepruntime.models import StepCredential


@sensitive_variables("token")
def grant(step_run_id: Any, base: str | None = None) -> str:
    """The step runtime API's URL for this step run, with a new credential in its user part
    and an empty password: `http://rlys_…:@127.0.0.1:8000`. relay_sdk and `ni` send it as
    HTTP Basic authentication (`rlys_…:`) and join absolute paths (`/spec`) onto the URL.
    (The colon matters: requests sends no authentication for a URL with a user and no
    password.) A second grant for the
    same step run replaces the first credential. It works while the step run is
    `in-progress` and never after. Call inside the transaction that starts the step.
    `base`: where the step reaches STEP_RUNTIME_URL, when not there itself (a sandbox reaches
    it on its own loopback: scriptsteps/network.py)."""
    token = StepCredential.issue(step_run_id)
    return with_user(base or settings.STEP_RUNTIME_URL, token)


def with_user(base: str, user: str) -> str:
    parts = urlsplit(base)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # an IPv6 literal
    netloc = f"{user}:@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
