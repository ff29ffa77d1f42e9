"""What an open run page has of its run, said small enough to ask with (pages.live):

- its version: a keyed hash of the run's and its steps' shown fields, read in one query (the
  same from Django's ORM and from the loop's psycopg);
- its ticket: who may see what on it, signed by the page Django rendered (the run, a mark of
  the session, whether the user may approve and cancel), good for PAGES_LIVE_TICKET_AGE
  seconds. With it the loop sends a changed part without Django (no session or user read);
  once it is older, or the session is another, Django answers the ask and gives a new one. A
  permission taken away shows on the open page within that age.
"""

import hashlib
import hmac
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core import signing
from django.db.models import QuerySet
from django.http import HttpRequest

from workflows.models import WorkflowRun

# What the live part shows that can change (workflows.models.SHOWN_LIVE, the steps' part,
# wakes the pages when it changes).
LIVE_FIELDS = (
    "status",
    "outcome",
    "message",
    "started_at",
    "ended_at",
    "steps__name",
    "steps__status",
    "steps__decision",
    "steps__decided_by_id",
    "steps__message",
    "steps__started_at",
    "steps__ended_at",
    # A rollout's progress (batch k of n), which its puppet-run step publishes while it waits.
    "steps__outputs__rollout",
)
TICKET_SALT = "pages.live"
# Where each page's own ticket goes in a live part rendered once for them all (pages.live).
TICKET_PLACEHOLDER = "relay-live-ticket-placeholder"


def shown_rows(run_id: Any) -> QuerySet:
    """The run's shown fields with each step's, in one query (a run without steps: one row)."""
    return WorkflowRun.objects.filter(pk=run_id).order_by("steps__index").values_list(*LIVE_FIELDS)


def version_of(rows: list[tuple]) -> str:
    """The rows' version: the same from the ORM (Django) and from psycopg (the loop)."""
    plain = [tuple(v.timestamp() if isinstance(v, datetime) else v for v in row) for row in rows]
    return _keyed(repr(plain))


def current_version(run_id: Any) -> str:
    """The version, through Django's connection (one query)."""
    return version_of(list(shown_rows(run_id)))


def _keyed(text: str) -> str:
    return hmac.new(settings.SECRET_KEY.encode(), text.encode(), hashlib.sha256).hexdigest()[:16]


def ticket_for(request: HttpRequest, run: WorkflowRun, may_approve: bool, may_cancel: bool) -> str:
    mark = _keyed(f"session:{request.session.session_key}")
    return signing.dumps([str(run.pk), mark, may_approve, may_cancel], salt=TICKET_SALT)


def ticket_rights(ticket: str, run_id: Any, session_key: str) -> tuple[bool, bool] | None:
    """(may approve, may cancel) that `ticket` gives on the run's page in that session; None
    when it gives nothing (another run or session, too old, not ours)."""
    try:
        run, mark, may_approve, may_cancel = signing.loads(
            ticket, salt=TICKET_SALT, max_age=settings.PAGES_LIVE_TICKET_AGE
        )
    except (signing.BadSignature, ValueError, TypeError):
        return None
    if (
        run != str(run_id)
        or not session_key
        or not hmac.compare_digest(mark, _keyed(f"session:{session_key}"))
    ):
        return None
    return bool(may_approve), bool(may_cancel)
