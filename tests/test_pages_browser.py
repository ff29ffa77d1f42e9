"""The pages in a real browser (headless Debian Chromium driven by Playwright, tests/browser.py)
against a live server with a real engine worker: a workflow made from YAML in the admin,
started from the Run form, its run page changing by itself while the steps run, an approval
answered on the page; a viewer without the permission gets no button and a refused POST.
Screenshots of each page go to the test's tmp_path."""

from collections.abc import Iterator
from datetime import UTC
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import Permission, User
from playwright.sync_api import Browser, Page, expect

from tests.browser import BrowserThread
from tests.script_helpers import running_script_workers
from tests.workflow_helpers import NOOP, make_workflow, step_in, steps_of
from workflows import engine
from workflows.models import WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)

SOURCE = f"""apiVersion: v1
description: Check, ask, deploy
parameters:
  target:
    description: The nodes to deploy to
  batch:
    description: How many nodes at once
    default: 5
steps:
- name: check
  image: {NOOP}
  spec:
    sleep: 2
- name: report
  image: relaysh/core
  input: ["echo would change 3 files on $(ni get -p {{.target}})"]
  spec:
    target: !Parameter target
  dependsOn: check
- name: approve-deploy
  type: approval
  description: Deploy to the nodes?
  dependsOn: report
- name: deploy
  image: {NOOP}
  spec:
    sleep: 1
  dependsOn: approve-deploy
"""


@pytest.fixture(scope="module")
def worker(django_db_setup, django_db_blocker, bao, live_server, tmp_path_factory) -> Iterator[None]:
    """The engine's worker (noop steps too) and a script steps' worker (real sandboxes)."""
    with running_script_workers(django_db_blocker, bao, live_server.url, tmp_path_factory.mktemp("pages")):
        yield


def log_in(page: Page, url: str, username: str, password: str) -> None:
    page.goto(f"{url}/app/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")


def test_made_from_yaml_started_from_the_form_watched_live_and_approved_on_the_page(
    live_server, worker, browser: BrowserThread, tmp_path: Path
):
    User.objects.create_superuser("root", password="root-password-1")
    url = live_server.url

    def journey(browser: Browser) -> str:
        page = browser.new_page()
        try:
            # The admin: a workflow from YAML.
            page.goto(f"{url}/admin/login/?next=/admin/workflows/workflow/add/")
            page.fill("#id_username", "root")
            page.fill("#id_password", "root-password-1")
            page.click("input[type=submit]")
            page.select_option("#id_owner", label="root")
            page.fill("#id_name", "deploy")
            page.fill("#id_source", SOURCE)
            page.click("input[name=_save]")
            expect(page.locator(".messagelist")).to_contain_text("was added successfully")

            # Its page: the graph dot drew, and the Run button.
            page.goto(f"{url}/app/workflows/")
            page.click("text=deploy")
            expect(page.locator(".graph svg")).to_contain_text("approve-deploy")
            expect(page.locator(".graph svg")).to_contain_text("approval")
            page.screenshot(path=tmp_path / "workflow.png", full_page=True)
            page.click("text=Run")

            # The form: the required one marked; a bad value and a missing one refused beside their fields.
            expect(page.locator("label[for=id_target] + .required")).to_have_text("(required)")
            expect(page.locator("#id_batch")).to_have_value("5")
            page.fill("#id_batch", "five")
            page.click("button[type=submit]")
            expect(page.locator("#id_target-errors")).to_have_text("A required parameter has no value.")
            expect(page.locator("#id_batch-errors")).to_contain_text("Not a number")
            page.screenshot(path=tmp_path / "run-form-errors.png", full_page=True)
            page.fill("#id_target", "web-*")
            page.fill("#id_batch", "2")
            page.click("button[type=submit]")

            # The run page changes by itself (no reload: the mark stays) as `check` ends and the gate opens.
            expect(page.locator("h1")).to_have_text("deploy #1")
            page.evaluate("window.notReloaded = true")
            assert page.locator("#approval-approve-deploy").count() == 0  # `check` takes 2 s
            page.click("#step-report summary")  # its log, opened before the step starts
            approval = page.locator("#approval-approve-deploy")
            expect(approval).to_contain_text("waits for an answer: Deploy to the nodes?", timeout=30_000)
            expect(page.locator("#row-check")).to_contain_text("success")
            # The log of a step that started after the page loaded, tailed into it.
            expect(page.locator("#step-report pre.log")).to_have_text("would change 3 files on web-*\n")
            expect(page.locator("#node-check")).to_contain_text("success")  # the graph too
            assert page.evaluate("window.notReloaded") is True
            page.screenshot(path=tmp_path / "run-waiting.png", full_page=True)

            # The keyboard: a step of the graph takes the focus, keeps it while the page keeps
            # asking (nothing changed: nothing swapped), and Enter goes to its row.
            page.focus("#node-check a")
            page.wait_for_timeout(2500)
            assert page.evaluate("document.activeElement.closest('g.node').id") == "node-check"
            page.keyboard.press("Enter")
            assert page.url.endswith("#step-check")
            # which opens the step: its part, asked for then.
            expect(page.locator("#step-check")).to_have_attribute("open", "")
            expect(page.locator("#step-check .step-detail")).to_contain_text("Status")
            # The step that waits: its spec as evaluated now, the parameter in it.
            page.click("#step-report summary")
            page.click("#step-report summary")
            expect(page.locator("#step-report .step-detail pre.spec")).to_contain_text('"target": "web-*"')

            approval.locator("button", has_text="Approve").click()
            expect(page.locator(".messages")).to_contain_text("Approved: approve-deploy.")
            page.evaluate("window.notReloaded = true")
            expect(page.locator("#run-status")).to_have_text("success", timeout=30_000)
            expect(page.locator("#row-deploy")).to_contain_text("success")
            assert page.evaluate("window.notReloaded") is True
            expect(page.locator("#live")).not_to_have_attribute(
                "hx-trigger", "load, again"
            )  # it stopped asking
            page.screenshot(path=tmp_path / "run-complete.png", full_page=True)
            run_url = page.url

            page.click("h1 a")
            expect(page.locator("table").last).to_contain_text("#1")
            expect(page.locator("table").last).to_contain_text("success")
            page.screenshot(path=tmp_path / "workflow-history.png", full_page=True)
            return run_url
        finally:
            page.close()

    run_url = browser.run(journey)
    run = WorkflowRun.objects.get()
    assert run_url == f"{url}/app/runs/{run.pk}/"
    assert (run.status, run.outcome, run.parameters) == (
        "complete",
        "success",
        {"target": "web-*", "batch": 2},
    )
    gate = steps_of(run)["approve-deploy"]
    assert (gate.decision, gate.decided_by.username) == ("approved", "root")
    assert sorted(path.name for path in tmp_path.glob("*.png")) == [
        "run-complete.png",
        "run-form-errors.png",
        "run-waiting.png",
        "workflow-history.png",
        "workflow.png",
    ]


def test_a_viewer_without_the_permission_sees_no_approve_button_and_the_server_refuses(
    live_server, worker, browser: BrowserThread, tmp_path: Path
):
    owner = User.objects.create_user("ops")
    viewer = User.objects.create_user("vic", password="vic-password-1", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename="view_workflowrun"))
    run = engine.create_run(make_workflow(owner, SOURCE, "deploy"), {"target": "db"}, created_by=owner)
    step_in(run, "approve-deploy", "in-progress")
    url = live_server.url

    def journey(browser: Browser) -> int:
        context = browser.new_context()
        page = context.new_page()
        try:
            log_in(page, url, "vic", "vic-password-1")
            page.goto(f"{url}/app/runs/{run.pk}/")
            approval = page.locator("#approval-approve-deploy")
            expect(approval).to_contain_text("someone who may approve must answer it")
            expect(approval.locator("button")).to_have_count(0)
            page.screenshot(path=tmp_path / "run-viewer.png", full_page=True)
            token = next(c["value"] for c in context.cookies() if c["name"] == "csrftoken")
            refused = page.request.post(
                f"{url}/app/runs/{run.pk}/steps/approve-deploy/approve/",
                headers={"X-CSRFToken": token, "Referer": page.url},
            )
            return refused.status
        finally:
            context.close()

    assert browser.run(journey) == 403
    assert steps_of(run)["approve-deploy"].status == "in-progress"
    engine.cancel_run(WorkflowRun.objects.get(pk=run.pk))


CANCEL_AND_FAIL = f"""apiVersion: v1
parameters:
  fail:
    default: ""
steps:
- name: slow
  image: {NOOP}
  spec:
    sleep: 3
    fail: !Parameter fail
- name: after
  image: {NOOP}
  dependsOn: slow
"""


def test_a_run_cancelled_from_its_page_and_a_failed_one_say_so(
    live_server, worker, browser: BrowserThread, tmp_path: Path
):
    owner = User.objects.create_user("ops", password="ops-password-1")
    workflow = make_workflow(owner, CANCEL_AND_FAIL, "slow")
    url = live_server.url

    def journey(browser: Browser) -> None:
        page = browser.new_page()
        try:
            log_in(page, url, "ops", "ops-password-1")
            page.goto(f"{url}/app/workflows/{workflow.pk}/run/")
            page.click("button[type=submit]")
            expect(page.locator("#row-slow")).to_contain_text("in-progress", timeout=30_000)
            page.click("text=Cancel run")
            expect(page.locator("#run-status")).to_have_text("cancelled", timeout=30_000)
            expect(page.locator("#row-after")).to_contain_text("skipped")
            page.screenshot(path=tmp_path / "run-cancelled.png", full_page=True)

            page.goto(f"{url}/app/workflows/{workflow.pk}/run/")
            page.fill("#id_fail", "the check found drift")
            page.click("button[type=submit]")
            expect(page.locator("h1")).to_have_text("slow #2")
            page.click("#step-slow summary")  # opened while it runs: its part follows it
            expect(page.locator("#run-status")).to_have_text("failure", timeout=30_000)
            expect(page.locator("#row-slow")).to_contain_text("the check found drift")
            expect(page.locator("#node-slow")).to_contain_text("failure")
            expect(page.locator("#step-slow .why")).to_have_text("Failed: the check found drift")
            expect(page.locator("#step-after .log-status")).to_have_text("skipped")
            page.screenshot(path=tmp_path / "run-failed.png", full_page=True)
        finally:
            page.close()

    browser.run(journey)
    assert [(r.outcome, r.created_by.username) for r in WorkflowRun.objects.order_by("created_at")] == [
        ("cancelled", "ops"),
        ("failure", "ops"),
    ]


def test_fifty_steps_are_drawn_readable_and_each_reachable_from_the_keyboard(
    live_server, browser: BrowserThread, tmp_path: Path
):
    steps = "".join(
        f"- name: step-{i:02d}\n  image: {NOOP}\n" + (f"  dependsOn: step-{i - 5:02d}\n" if i >= 5 else "")
        for i in range(50)
    )
    owner = User.objects.create_user("ops", password="ops-password-1")
    workflow = make_workflow(owner, f"apiVersion: v1\nsteps:\n{steps}", "big")
    run = engine.create_run(workflow, {}, created_by=owner)
    url = live_server.url

    def journey(browser: Browser) -> list[float]:
        page = browser.new_page()
        try:
            log_in(page, url, "ops", "ops-password-1")
            expect(page.locator("h1")).to_have_text("Workflows")
            page.goto(f"{url}/app/runs/{run.pk}/")
            expect(page.locator(".graph g.node")).to_have_count(50)
            page.screenshot(path=tmp_path / "run-50-steps.png", full_page=True)
            # The workflow's page draws it the same, and holds still (a run's page is live).
            page.goto(f"{url}/app/workflows/{workflow.pk}/")
            heights = []
            for i in range(50):
                node = page.locator(f"#node-step-{i:02d}")
                node.locator("a").focus()  # each step's link takes the focus, and scrolls into view
                assert page.evaluate("document.activeElement.closest('g.node').id") == f"node-step-{i:02d}"
                heights.append(node.locator("text").first.bounding_box()["height"])
            return heights
        finally:
            page.close()

    heights = browser.run(journey)
    assert min(heights) >= 12  # pixels: dot's 11-point labels at their size, never shrunk to fit


def test_the_steps_labels_follow_the_steps_without_their_logs_being_opened(
    live_server, worker, browser: BrowserThread, tmp_path: Path
):
    owner = User.objects.create_user("ops", password="ops-password-1")
    workflow = make_workflow(owner, CANCEL_AND_FAIL, "slow")
    run = engine.create_run(workflow, {}, created_by=owner)
    url = live_server.url

    def journey(browser: Browser) -> None:
        page = browser.new_page()
        try:
            log_in(page, url, "ops", "ops-password-1")
            page.goto(f"{url}/app/runs/{run.pk}/")
            expect(page.locator("#step-after .log-status")).to_have_text("pending")
            expect(page.locator("#run-status")).to_have_text("success", timeout=30_000)
            # Closed, never opened: their labels changed with the steps all the same.
            expect(page.locator("#step-slow .log-status")).to_have_text("success")
            expect(page.locator("#step-after .log-status")).to_have_text("success")
            assert page.locator("details[open]").count() == 0
        finally:
            page.close()

    browser.run(journey)


def test_times_show_to_the_second_in_the_browser_s_time_zone_saying_which(
    live_server, browser: BrowserThread, tmp_path: Path
):
    owner = User.objects.create_user("ops", password="ops-password-1")
    run = engine.create_run(make_workflow(owner, CANCEL_AND_FAIL, "slow"), {}, created_by=owner)
    created = run.created_at.astimezone(ZoneInfo("Asia/Kolkata")).strftime("%Y-%m-%d %H:%M:%S")
    url = live_server.url

    def journey(browser: Browser) -> tuple[str, str, str]:
        context = browser.new_context(timezone_id="Asia/Kolkata")
        page = context.new_page()
        try:
            log_in(page, url, "ops", "ops-password-1")
            page.goto(f"{url}/app/runs/{run.pk}/")
            created = page.locator("main > p time").first
            expect(created).to_have_attribute("data-local", "true")
            page.screenshot(path=tmp_path / "run-local-times.png", full_page=True)
            return created.text_content(), created.get_attribute("title"), created.get_attribute("datetime")
        finally:
            context.close()

    shown, title, moment = browser.run(journey)
    assert shown == f"{created} GMT+5:30"
    assert title == run.created_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    assert moment == run.created_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
