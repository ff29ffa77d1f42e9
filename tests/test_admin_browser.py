"""The admin in a real browser (headless Debian Chromium driven by Playwright, tests/browser.py)
against a live server: a connection and a trigger made in the admin each show their first
token once, and never again (not after Done, not going back to the page that showed it);
the database keeps its digest only. A workflow's page says what its steps and triggers need,
and its link makes the missing connection. An approval's page has no Approve button for a
user without the permission, and the server refuses the POST anyway. Screenshots of each
page go to the test's tmp_path."""

import re
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from playwright.sync_api import Browser, Page, expect
from playwright.sync_api import Error as PlaywrightError

from puppet_connection.models import PuppetConnection
from relay import tokens
from tests.browser import BrowserThread
from tests.workflow_helpers import NOOP, make_workflow, waiting_at_gate
from triggers.models import Trigger
from workflows import engine
from workflows.models import StepRun, Workflow

pytestmark = pytest.mark.django_db(transaction=True)


def admin_login(page: Page, url: str, next_url: str) -> None:
    page.goto(f"{url}/admin/login/?next={next_url}")
    page.fill("#id_username", "root")
    page.fill("#id_password", "root-password-1")
    page.click("input[type=submit]")


def shown_once(page: Page, selector: str) -> str:
    """The token on the page that answers the save, then Done: the change page has none, and
    going back to the answer does not show it again (no-store: the browser kept no copy)."""
    token = page.locator(selector).inner_text().strip()
    assert tokens.LEAK_RE.fullmatch(token), token
    page.click("text=Done")
    expect(page).to_have_url(re.compile(r"/change/$"))  # the holder's own page
    page.wait_for_load_state()
    assert token not in page.content()
    with pytest.raises(PlaywrightError, match="ERR_CACHE_MISS"):
        page.go_back()  # the browser would have to post the form again: it asks instead
    page.wait_for_load_state()
    expect(page.locator("body")).not_to_contain_text(token)
    return token


def stored_as_digest(row: tokens.DigestToken, token: str) -> None:
    """The row keeps the token's lookup part and digest, never the token."""
    values = type(row).objects.filter(pk=row.pk).values().get()
    assert token not in repr(values) and token[17:-6] not in repr(values)
    assert values["token_digest"] == tokens.digest(token, values["token_pepper_id"])
    assert type(row).for_token(token) == row


def test_a_connection_made_in_the_admin_shows_its_token_once(
    live_server, browser: BrowserThread, tmp_path: Path, settings
):
    User.objects.create_superuser("root", password="root-password-1")
    url = settings.RELAY_PUBLIC_URL = live_server.url

    def journey(browser: Browser) -> str:
        page = browser.new_page()
        try:
            admin_login(page, url, "/admin/puppet_connection/puppetconnection/add/")
            page.fill("#id_name", "prod")
            page.select_option("#id_backend", "bolt")
            page.click("input[name=_save]")
            expect(page.locator(".errornote")).to_contain_text("Copy it now; it will not be shown again.")
            page.screenshot(path=tmp_path / "connection-token.png", full_page=True)
            token = shown_once(page, "#relay-token")
            # Its page: no bridge yet, and the configuration to paste, naming the token.
            page.goto(f"{url}/admin/puppet_connection/puppetconnection/")
            page.click("text=prod")
            expect(page.locator(".field-bridge")).to_contain_text("No bridge has called")
            expect(page.locator("pre.bridge-yaml")).to_contain_text('relay_connection_token: "<the token of')
            expect(page.locator("pre.bridge-yaml")).to_contain_text(f"relay_api_url: {url}/")
            assert token not in page.content()
            page.screenshot(path=tmp_path / "connection-page.png", full_page=True)
            return token
        finally:
            page.close()

    token = browser.run(journey)
    stored_as_digest(PuppetConnection.objects.get(name="prod"), token)
    assert {p.name for p in tmp_path.glob("*.png")} == {"connection-token.png", "connection-page.png"}


def test_a_trigger_made_in_the_admin_shows_its_token_once(
    live_server, browser: BrowserThread, tmp_path: Path
):
    User.objects.create_superuser("root", password="root-password-1")
    url = live_server.url

    def journey(browser: Browser) -> str:
        page = browser.new_page()
        try:
            admin_login(page, url, "/admin/triggers/trigger/add/")
            page.fill("#id_name", "reports")
            page.click("input[name=_save]")
            expect(page.locator(".errornote")).to_contain_text("Copy it now; it will not be shown again.")
            expect(page.locator("#content-main")).to_contain_text("was created")
            page.screenshot(path=tmp_path / "trigger-token.png", full_page=True)
            return shown_once(page, "#relay-token")
        finally:
            page.close()

    token = browser.run(journey)
    trigger = Trigger.objects.get(name="reports")
    assert (
        token.startswith("rlyt_") and trigger.token_regenerated_at is None
    )  # its first, not a regenerated one
    stored_as_digest(trigger, token)


CONNECTED = f"""apiVersion: v1
triggers:
- name: reports
  source: {{type: push}}
- name: merged
  source:
    type: webhook
    image: relaysh/stdlib-trigger-json
steps:
- name: deploy
  image: {NOOP}
  spec:
    connection: ${{connections.puppet['fleet']}}
"""


def test_a_workflow_s_page_says_what_it_needs_and_makes_the_missing_connection(
    live_server, browser: BrowserThread, tmp_path: Path, settings
):
    User.objects.create_superuser("root", password="root-password-1")
    url = settings.RELAY_PUBLIC_URL = live_server.url

    def journey(browser: Browser) -> dict[str, str]:
        page = browser.new_page()
        try:
            # Made from YAML in the admin: each new trigger's first token, that once.
            admin_login(page, url, "/admin/workflows/workflow/add/")
            page.select_option("#id_owner", label="root")
            page.fill("#id_name", "deploy")
            page.fill("#id_source", CONNECTED)
            page.click("input[name=_save]")
            expect(page.locator(".errornote")).to_contain_text("Copy each token now")
            shown = {
                name: page.locator(f"#trigger-{name} code.relay-token").inner_text()
                for name in ("reports", "merged")
            }
            page.screenshot(path=tmp_path / "workflow-trigger-tokens.png", full_page=True)
            page.click("text=Done")
            expect(page).to_have_url(re.compile(r"/change/$"))
            page.wait_for_load_state()
            for token in shown.values():
                assert token not in page.content()

            # Its page: where each trigger's events go and what to paste; the connection missing.
            page.goto(f"{url}/app/workflows/")
            page.click("text=deploy")
            expect(page.locator("#trigger-reports")).to_contain_text(f"relay_api_url: {url}/")
            expect(page.locator("#trigger-reports")).to_contain_text("reports = http")
            expect(page.locator("#trigger-merged")).to_contain_text("curl --fail-with-body -X POST")
            expect(page.locator("#connection-puppet-fleet")).to_contain_text("missing")
            for token in shown.values():
                assert token not in page.content()
            page.screenshot(path=tmp_path / "workflow-needs.png", full_page=True)

            # The link makes it: the admin's form with the name filled in, then its token once.
            page.click("text=Create the puppet connection fleet")
            expect(page.locator("#id_name")).to_have_value("fleet")
            page.click("input[name=_save]")
            expect(page.locator("#relay-token")).to_contain_text("rlyp_")
            page.goto(f"{url}/app/workflows/")
            page.click("text=deploy")
            expect(page.locator("#connection-puppet-fleet")).to_contain_text("exists")
            page.screenshot(path=tmp_path / "workflow-connected.png", full_page=True)
            return shown
        finally:
            page.close()

    shown = browser.run(journey)
    workflow = Workflow.objects.get(name="deploy")
    for name, token in shown.items():
        trigger = Trigger.objects.get(workflow=workflow, name=name)
        stored_as_digest(trigger, token)
    assert PuppetConnection.objects.get(name="fleet").owner == workflow.owner
    assert re.fullmatch(r"rlyt_\w+", shown["merged"])


GATED = f"""apiVersion: v1
steps:
- name: a
  image: {NOOP}
- name: gate
  type: approval
  description: Deploy it?
  dependsOn: a
"""


def test_an_approval_in_the_admin_has_no_button_for_a_viewer_and_the_server_refuses_the_post(
    live_server, browser: BrowserThread, tmp_path: Path
):
    owner = User.objects.create_user("ops")
    viewer = User.objects.create_user("vic", password="vic-password-1", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename="view_workflowrun"))
    gate = waiting_at_gate(engine.create_run(make_workflow(owner, GATED), {}, created_by=owner))
    url = live_server.url

    def journey(browser: Browser) -> int:
        context = browser.new_context()
        page = context.new_page()
        try:
            page.goto(f"{url}/admin/login/?next=/admin/workflows/approval/")
            page.fill("#id_username", "vic")
            page.fill("#id_password", "vic-password-1")
            page.click("input[type=submit]")
            expect(page.locator("#content h1")).to_have_text("Approvals")
            page.click("text=gate")
            expect(page.locator("#content")).to_contain_text(
                "waits for an answer from someone who may approve"
            )
            expect(page.locator("input[name=approve]")).to_have_count(0)
            page.screenshot(path=tmp_path / "approval-viewer.png", full_page=True)
            token = next(c["value"] for c in context.cookies() if c["name"] == "csrftoken")
            refused = page.request.post(
                f"{url}/admin/workflows/approval/{gate.pk}/approve/",
                headers={"X-CSRFToken": token, "Referer": page.url},
            )
            return refused.status
        finally:
            context.close()

    assert browser.run(journey) == 403
    assert StepRun.objects.get(pk=gate.pk).status == "in-progress"
