"""An open run page's live part against the server as production runs it (relay.asgi under
relay.server): its asks wait on the loop for a change to the run (pages.live), the pages of
one run share one read of its version per change, and an unchanged run is a 204 from the
loop. Counted in reads and queries, never timed."""

import json
import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import requests
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from pages import live
from tests.events_helpers import wait_until
from tests.workflow_helpers import NOOP, make_workflow
from workflows import engine
from workflows.models import StepRun, WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)

SOURCE = f"""apiVersion: v1
steps:
- name: a
  image: {NOOP}
- name: b
  image: {NOOP}
  dependsOn: a
"""
PAGES = 20


def waiting(run: WorkflowRun) -> int:
    watch = live._watches.get(run.pk)
    return len(watch.waiters) if watch is not None else 0


@pytest.fixture
def watched(alice) -> tuple[WorkflowRun, dict[str, str], dict[str, str]]:
    """A run; the headers its page asks with (the version it shows, its ticket); and the
    owner's session cookie."""
    run = engine.create_run(make_workflow(alice, SOURCE), {}, created_by=alice)
    return run, *page_of(run, alice)


def page_of(run: WorkflowRun, user) -> tuple[dict[str, str], dict[str, str]]:
    client = Client()
    client.force_login(user)
    page = client.get(f"/app/runs/{run.pk}/").content.decode()
    headers = json.loads(re.search(r"hx-headers='([^']*)'", page)[1])
    return headers, {"sessionid": client.cookies["sessionid"].value}


def test_the_pages_of_a_run_wait_for_its_change_and_get_it_with_one_read_and_render_for_all(
    live_server, watched
):
    run, headers, cookies = watched
    url = f"{live_server.url}/app/runs/{run.pk}/live/"
    reads, rendered = live.reads, live.rendered
    with ThreadPoolExecutor(PAGES) as pool:
        asks = [
            pool.submit(requests.get, url, headers=headers, cookies=cookies, timeout=60) for _ in range(PAGES)
        ]
        wait_until(lambda: waiting(run) == PAGES, timeout=30)
        assert live.reads - reads == 1  # the first page's read; the others had it
        assert not any(ask.done() for ask in asks)
        with CaptureQueriesContext(connection) as queries:
            run.begin()  # a change: notified
        assert len(queries) == 2  # the UPDATE and its NOTIFY
        answers = [ask.result() for ask in asks]
    assert [answer.status_code for answer in answers] == [200] * PAGES
    assert all('id="run-status">in-progress</span>' in answer.text for answer in answers)
    # One more read for the change and one rendering, whatever the number of pages; each page
    # gets its own ticket back, and its forms their CSRF token from the page (run.js).
    assert (live.reads - reads, live.rendered - rendered) == (2, 1)
    assert f'"X-Live-Ticket": "{headers["X-Live-Ticket"]}"' in answers[0].text
    assert ">Cancel run</button>" in answers[0].text and "csrfmiddlewaretoken" not in answers[0].text
    assert waiting(run) == 0 and run.pk not in live._watches


def test_a_ticket_stands_for_its_own_session_run_and_rights_only(live_server, watched, alice, settings):
    run, headers, cookies = watched
    viewer = User.objects.create_user("vic", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename="view_workflowrun"))
    viewer_headers, viewer_cookies = page_of(run, viewer)
    other = engine.create_run(make_workflow(alice, SOURCE, "other"), {}, created_by=alice)
    stale = {**headers, "X-Live-Version": "0" * 16}
    rendered = live.rendered

    def ask(headers: dict[str, str], cookies: dict[str, str], run: WorkflowRun = run) -> str:
        answer = requests.get(f"{live_server.url}/app/runs/{run.pk}/live/", headers=headers, cookies=cookies)
        assert answer.status_code == 200
        return answer.text

    # Its own: rendered on the loop, with the owner's Cancel; the viewer's, without.
    assert ">Cancel run</button>" in ask(stale, cookies) and live.rendered == rendered + 1
    part = ask({**viewer_headers, "X-Live-Version": "0" * 16}, viewer_cookies)
    assert ">Cancel run</button>" not in part and live.rendered == rendered + 2
    # The owner's ticket in the viewer's session, or for another run, or too old: Django's
    # answer, with the rights of the session's user and a new ticket.
    part = ask(stale, viewer_cookies)
    assert ">Cancel run</button>" not in part and headers["X-Live-Ticket"] not in part
    part = ask({**stale, "X-Live-Ticket": page_of(other, alice)[0]["X-Live-Ticket"]}, cookies)
    assert ">Cancel run</button>" in part and "X-Live-Ticket" in part
    settings.PAGES_LIVE_TICKET_AGE = 0
    ask(stale, cookies)
    assert live.rendered == rendered + 2


def test_an_unchanged_run_is_a_204_from_the_loop_after_the_wait(live_server, watched, settings):
    run, headers, cookies = watched
    settings.PAGES_LIVE_WAIT = 1
    url = f"{live_server.url}/app/runs/{run.pk}/live/"
    answer = requests.get(url, headers=headers, cookies=cookies, timeout=30)
    assert (answer.status_code, answer.headers["X-Live-Waited"]) == (204, "1")
    # A version it never gave (or none) is Django's to answer, at once: here, the part anew.
    answer = requests.get(url, headers={"X-Live-Version": "0" * 16}, cookies=cookies, timeout=30)
    assert answer.status_code == 200 and "X-Live-Waited" not in answer.headers
    # and without a session, Django's login, whatever the version.
    answer = requests.get(url, headers={"X-Live-Version": "0" * 16}, timeout=30, allow_redirects=False)
    assert answer.status_code == 302 and "/app/login/" in answer.headers["Location"]


def test_a_step_s_change_wakes_the_pages_and_one_of_another_run_does_not(live_server, watched, alice):
    run, headers, cookies = watched
    other = engine.create_run(make_workflow(alice, SOURCE, "other"), {}, created_by=alice)
    url = f"{live_server.url}/app/runs/{run.pk}/live/"
    with ThreadPoolExecutor(1) as pool:
        ask = pool.submit(requests.get, url, headers=headers, cookies=cookies, timeout=60)
        wait_until(lambda: waiting(run) == 1, timeout=30)
        reads = live.reads
        StepRun.objects.get(run=other, name="a").skip("not this one")
        other.finish("cancelled")
        step = StepRun.objects.get(run=run, name="b")
        StepRun.objects.filter(pk=step.pk).update(attempts=3)  # not through a transition: no wake
        assert not ask.done() and live.reads == reads
        step.skip("the page shows this")
        answer = ask.result()
    assert answer.status_code == 200 and "the page shows this" in answer.text


def test_a_waiting_steps_published_progress_wakes_its_pages(live_server, watched):
    """A rollout's puppet-run step publishes its progress (batch k of n) each time it waits:
    that is shown, so it wakes the pages as a status change does."""
    run, headers, cookies = watched
    run.begin()
    step = StepRun.objects.get(run=run, name="a")
    lease = uuid.uuid4()
    StepRun.objects.filter(pk=step.pk).update(status="in-progress", lease_id=lease)
    headers, cookies = page_of(run, run.created_by)  # the page as it is now
    url = f"{live_server.url}/app/runs/{run.pk}/live/"
    with ThreadPoolExecutor(1) as pool:
        ask = pool.submit(requests.get, url, headers=headers, cookies=cookies, timeout=60)
        wait_until(lambda: waiting(run) == 1, timeout=30)
        progress = {
            "state": "running",
            "batch": 2,
            "batches": 3,
            "nodes": 9,
            "nodes_done": 3,
            "nodes_failed": 0,
        }
        # What the page does not show (a Puppet step's id at each wait) wakes nobody: no re-read.
        reads = live.reads
        assert step.record_wait(lease, {}, {"id": "x"}, timezone.now() + timedelta(minutes=1), None)
        StepRun.objects.filter(pk=step.pk).update(lease_id=lease)  # held again, as a worker would
        step = StepRun.objects.get(pk=step.pk)
        time.sleep(1)
        assert live.reads == reads and not ask.done()
        assert step.record_wait(lease, {}, {"rollout": progress}, timezone.now() + timedelta(minutes=1), None)
        answer = ask.result()
    assert answer.status_code == 200
    assert "Rollout: batch 2 of 3 (running), 3 of 9 nodes done, 0 failed" in answer.text
