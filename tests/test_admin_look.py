"""The admin as a user reads it (issue 20's smaller defects): headings named, lists titled by
what they list, "View site" going somewhere, times to the second saying their zone, and a
revision's YAML with its indentation."""

import re
from datetime import UTC, datetime, timedelta

from django.contrib.auth.models import User
from django.test import Client

from tests.workflow_helpers import NOOP, make_workflow, waiting_at_gate
from workflows import engine
from workflows.models import StepRun, Workflow

SOURCE = f"""apiVersion: v1
parameters:
  target:
    description: The nodes
    default: web
steps:
- name: a
  image: {NOOP}
- name: gate
  type: approval
  description: Deploy it?
  dependsOn: a
"""
SECOND = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} UTC")


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_index_names_each_part_in_words_and_view_site_goes_to_the_pages(staff):
    admin = logged_in(staff)
    page = admin.get("/admin/").content.decode()
    assert "Puppet_Connection" not in page and "puppet_connection</a>" not in page
    assert 'class="section" title="Models in the Puppet application">Puppet</a>' in page
    assert ">Puppet runs</a>" in page
    assert "Django administration" not in page and "Relay for Puppet" in page
    site = re.search(r'<a href="([^"]+)">View site</a>', page).group(1)
    assert admin.get(site).status_code == 200  # not a 404


def test_a_list_is_titled_by_what_it_lists(staff):
    page = logged_in(staff).get("/admin/workflows/workflowrun/").content.decode()
    assert "<h1>Workflow runs</h1>" in page and "Select workflow run" not in page
    assert "<title>Workflow runs | Relay for Puppet admin</title>" in page


def test_an_approval_s_deadline_is_to_the_second_and_says_utc(staff):
    gate = waiting_at_gate(engine.create_run(make_workflow(staff, SOURCE), {}))
    deadline = datetime(2026, 11, 26, 5, 18, 28, 107082, tzinfo=UTC)
    StepRun.objects.filter(pk=gate.pk).update(recheck_at=deadline)
    page = logged_in(staff).get(f"/admin/workflows/approval/{gate.pk}/change/").content.decode()
    assert "waits for an answer until 2026-11-26 05:18:28 UTC; read what it approves" in page
    assert '<div class="readonly">2026-11-26 05:18:28 UTC</div>' in page  # the "answer by" field
    assert "a.m." not in page and "+00:00" not in page and "107082" not in page
    listed = logged_in(staff).get("/admin/workflows/approval/").content.decode()
    assert "2026-11-26 05:18:28 UTC" in listed


def test_runs_show_their_times_to_the_second(staff):
    run = engine.create_run(make_workflow(staff, SOURCE), {})
    page = logged_in(staff).get(f"/admin/workflows/workflowrun/{run.pk}/change/").content.decode()
    created = run.created_at.astimezone(UTC) - timedelta(microseconds=run.created_at.microsecond)
    assert f"{created:%Y-%m-%d %H:%M:%S} UTC" in page
    assert SECOND.search(logged_in(staff).get("/admin/workflows/workflowrun/").content.decode())


def test_a_revision_s_document_keeps_its_indentation(staff):
    workflow = make_workflow(staff, SOURCE)
    page = logged_in(staff).get(f"/admin/workflows/workflow/{workflow.pk}/change/").content.decode()
    assert (
        '<pre class="revision-source" style="margin:0">apiVersion: v1\nparameters:\n  target:\n'
        "    description: The nodes\n" in page
    )


def test_a_trigger_s_page_has_its_sender_s_settings_naming_the_token(staff, settings):
    from relay.tokens import LEAK_RE
    from triggers.models import Trigger

    settings.RELAY_PUBLIC_URL = "https://relay.example.com"
    trigger, _ = Trigger.create_with_token(owner=staff, name="reports")
    page = logged_in(staff).get(f"/admin/triggers/trigger/{trigger.pk}/change/").content.decode()
    placeholder = f"&lt;the token of trigger reports, {trigger.token_prefix}…&gt;"
    assert (
        f"relay_api_url: https://relay.example.com/\nrelay_trigger_token: &quot;{placeholder}&quot;" in page
    )
    assert f"reporturl = https://any:{placeholder}@relay.example.com/api/events" in page
    assert LEAK_RE.search(page) is None


def test_the_page_with_a_new_trigger_s_token_links_to_its_settings(staff):
    from tests.test_workflow_admin import form

    source = SOURCE.replace("steps:\n", "triggers:\n- name: reports\n  source: {type: push}\nsteps:\n")
    page = logged_in(staff).post("/admin/workflows/workflow/add/", form(staff, source)).content.decode()
    workflow = Workflow.objects.get()
    link = f'<a href="/app/workflows/{workflow.pk}/#trigger-reports">the settings to paste</a>'
    assert f"Puppet's reports: {link}" in page
