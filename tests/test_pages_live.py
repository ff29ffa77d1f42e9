"""An open run page's live part against the server as production runs it (relay.asgi under
relay.server): its asks wait on the loop for a change to the run (pages.live), the pages of
one run share one read of its version per change, and an unchanged run is a 204 from the
loop. Counted in reads and queries, never timed."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

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
def watched(alice) -> tuple[WorkflowRun, str, dict[str, str]]:
    """A run, the version its page shows, and its owner's session cookie."""
    run = engine.create_run(make_workflow(alice, SOURCE), {}, created_by=alice)
    client = Client()
    client.force_login(alice)
    page = client.get(f"/app/runs/{run.pk}/").content.decode()
    version = page.split('"X-Live-Version": "')[1].split('"')[0]
    return run, version, {"sessionid": client.cookies["sessionid"].value}


def test_the_pages_of_a_run_wait_for_its_change_with_one_read_for_them_all(live_server, watched):
    run, version, cookies = watched
    url = f"{live_server.url}/app/runs/{run.pk}/live/"
    before = live.reads
    with ThreadPoolExecutor(PAGES) as pool:
        asks = [
            pool.submit(requests.get, url, headers={"X-Live-Version": version}, cookies=cookies, timeout=60)
            for _ in range(PAGES)
        ]
        wait_until(lambda: waiting(run) == PAGES, timeout=30)
        assert live.reads - before == 1  # the first page's read; the others had it
        assert not any(ask.done() for ask in asks)
        with CaptureQueriesContext(connection) as queries:
            run.begin()  # a change: notified
        assert len(queries) == 2  # the UPDATE and its NOTIFY
        answers = [ask.result() for ask in asks]
    assert [answer.status_code for answer in answers] == [200] * PAGES
    assert all('id="run-status">in-progress</span>' in answer.text for answer in answers)
    assert live.reads - before == 2  # one more for the change, whatever the number of pages
    assert waiting(run) == 0 and run.pk not in live._watches


def test_an_unchanged_run_is_a_204_from_the_loop_after_the_wait(live_server, watched, settings):
    run, version, cookies = watched
    settings.PAGES_LIVE_WAIT = 1
    url = f"{live_server.url}/app/runs/{run.pk}/live/"
    answer = requests.get(url, headers={"X-Live-Version": version}, cookies=cookies, timeout=30)
    assert (answer.status_code, answer.headers["X-Live-Waited"]) == (204, "1")
    # A version it never gave (or none) is Django's to answer, at once: here, the part anew.
    answer = requests.get(url, headers={"X-Live-Version": "0" * 16}, cookies=cookies, timeout=30)
    assert answer.status_code == 200 and "X-Live-Waited" not in answer.headers
    # and without a session, Django's login, whatever the version.
    answer = requests.get(url, headers={"X-Live-Version": "0" * 16}, timeout=30, allow_redirects=False)
    assert answer.status_code == 302 and "/app/login/" in answer.headers["Location"]


def test_a_step_s_change_wakes_the_pages_and_one_of_another_run_does_not(live_server, watched, alice):
    run, version, cookies = watched
    other = engine.create_run(make_workflow(alice, SOURCE, "other"), {}, created_by=alice)
    url = f"{live_server.url}/app/runs/{run.pk}/live/"
    with ThreadPoolExecutor(1) as pool:
        ask = pool.submit(requests.get, url, headers={"X-Live-Version": version}, cookies=cookies, timeout=60)
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
