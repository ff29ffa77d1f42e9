"""The workflow and run pages, through Django's test client: what each shows and who may do
what (workflows.permissions, as the API and the admin). tests/test_pages_browser.py drives
them in a real browser."""

import re

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from pages import views
from tests.workflow_helpers import NOOP, make_workflow, steps_of, waiting_at_gate
from workflows import engine
from workflows.models import StepRun, WorkflowRun

SOURCE = f"""apiVersion: v1
parameters:
  target:
    description: The nodes to deploy to
  retries:
    description: How many times to try
    default: 2
  note:
    default: hello
steps:
- name: a
  image: {NOOP}
  spec:
    outputs: {{changes: 3}}
- name: gate
  type: approval
  description: Deploy it?
  dependsOn: a
- name: deploy
  image: {NOOP}
  dependsOn: gate
"""


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def with_perms(name: str, *codenames: str) -> User:
    user = User.objects.create_user(name, is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    return user


def test_a_page_needs_a_login_and_any_active_user_may_log_in(alice):
    assert Client().get("/app/workflows/").url.startswith("/app/login/")
    client = Client()
    response = client.post(
        "/app/login/?next=/app/workflows/", {"username": "alice", "password": "alice-password-1"}
    )
    assert response.url == "/app/workflows/"  # not staff: the admin's own login would refuse her
    assert client.get("/app/workflows/").status_code == 200


def test_the_workflow_page_draws_the_steps_and_numbers_the_runs(alice):
    workflow = make_workflow(alice, SOURCE)
    for _ in range(2):
        engine.create_run(workflow, {"target": "web"}, created_by=alice)
    page = logged_in(alice).get(f"/app/workflows/{workflow.pk}/").content.decode()
    svg = page[page.index("<svg") : page.index("</svg>")]
    assert "<title>gate</title>" in svg and 'href="#step-gate"' in svg and "approval" in svg  # dot drew it
    assert re.findall(r">#(\d+)</a>", page) == ["2", "1"]  # newest first, numbered from the first
    assert "initializing" in page and ">alice<" in page
    assert f'href="/app/workflows/{workflow.pk}/run/"' in page
    assert '<pre class="source">apiVersion: v1\nparameters:\n  target:\n    description:' in page  # indented


def test_each_revision_says_what_changed_from_the_one_before(alice):
    workflow = make_workflow(alice, SOURCE)
    workflow.add_revision(SOURCE.replace("default: 2", "default: 4"), alice)
    page = logged_in(alice).get(f"/app/workflows/{workflow.pk}/").content.decode()
    assert "What changed from revision 1" in page and "What changed from revision 0" not in page
    assert '<span class="removed">-    default: 2</span>\n<span class="added">+    default: 4</span>' in page


def test_a_workflows_page_shows_a_bounded_history_however_large_its_documents(alice, monkeypatch):
    """Ten revisions at most; a document shown to SOURCE_SHOWN characters, changes diffed only
    up to DIFF_MAX_LINES lines and shown to CHANGES_SHOWN lines (documents may be 1 MiB)."""
    monkeypatch.setattr(views, "SOURCE_SHOWN", 400)
    monkeypatch.setattr(views, "DIFF_MAX_LINES", 60)
    monkeypatch.setattr(views, "CHANGES_SHOWN", 10)
    steps = "".join(f"- name: s{i}\n  image: {NOOP}\n" for i in range(20))  # 40 lines
    workflow = make_workflow(alice, f"apiVersion: v1\nsteps:\n{steps}")
    for n in range(2, 13):
        workflow.add_revision(f"apiVersion: v1\nsteps:\n{steps.replace('name: s', f'name: r{n}s')}", alice)
    longer = "".join(f"- name: t{i}\n  image: {NOOP}\n" for i in range(40))  # 80 lines
    workflow.add_revision(f"apiVersion: v1\nsteps:\n{longer}", alice)
    page = logged_in(alice).get(f"/app/workflows/{workflow.pk}/").content.decode()
    assert re.findall(r'<details id="revision-(\d+)"', page) == [str(n) for n in range(13, 3, -1)]
    assert "(not shown here: over 60 lines to compare)" in page  # 13 against 12
    assert "(the first 10 lines of the changes)" in page  # 12 against 11: 40 lines changed
    assert "(its first 400 characters; the whole document is in the API" in page
    assert "name: t39" not in page


def test_the_admin_links_to_the_pages(staff):
    page = logged_in(staff).get("/admin/").content.decode()
    assert '<a href="/app/workflows/">View site</a>' in page
    assert logged_in(staff).get("/app/").url == "/app/workflows/"


def test_the_runs_filtered_by_status_keep_their_numbers(alice):
    workflow = make_workflow(alice, SOURCE)
    for outcome in ["failure", "success", "failure", ""]:
        run = engine.create_run(workflow, {"target": "web"}, created_by=alice)
        if outcome:
            run.finish(outcome)
    client = logged_in(alice)
    page = client.get(f"/app/workflows/{workflow.pk}/?status=failure").content.decode()
    assert re.findall(r">#(\d+)</a>", page) == ["3", "1"]
    page = client.get(f"/app/workflows/{workflow.pk}/?status=initializing").content.decode()
    assert re.findall(r">#(\d+)</a>", page) == ["4"]
    assert client.get(f"/app/workflows/{workflow.pk}/?status=done").status_code == 400
    run = WorkflowRun.objects.get(outcome="success")
    assert "wf</a> #2</h1>" in client.get(f"/app/runs/{run.pk}/").content.decode()


def test_without_graphviz_the_pages_show_the_steps_in_words(alice, monkeypatch):
    from pages import graph

    monkeypatch.setattr(graph, "DOT", "/nonexistent/dot")
    graph.svg_of.cache_clear()
    run = engine.create_run(make_workflow(alice, SOURCE), {"target": "web"}, created_by=alice)
    page = logged_in(alice).get(f"/app/runs/{run.pk}/").content.decode()
    assert "No picture: Graphviz&#x27;s" not in page  # (the message is markup, not escaped text)
    assert "No picture: Graphviz's <code>/nonexistent/dot</code> could not draw it" in page
    assert '<tr id="row-gate">' in page


def test_another_user_without_permissions_sees_no_workflow_of_alice(alice, bob):
    workflow = make_workflow(alice, SOURCE)
    assert logged_in(bob).get(f"/app/workflows/{workflow.pk}/").status_code == 404
    assert "wf" not in logged_in(bob).get("/app/workflows/").content.decode()


def test_the_run_form_marks_required_parameters_and_puts_errors_next_to_the_field(alice):
    workflow = make_workflow(alice, SOURCE)
    client = logged_in(alice)
    url = f"/app/workflows/{workflow.pk}/run/"
    page = client.get(url).content.decode()
    assert page.count("(required)") == 1 and "The nodes to deploy to" in page and 'value="2"' in page
    page = client.post(url, {"target": "", "retries": "three", "note": "hi"}).content.decode()
    assert '<ul class="errorlist" id="id_target-errors"><li>A required parameter has no value.</li>' in page
    assert '<ul class="errorlist" id="id_retries-errors"><li>Not a number: write it as JSON' in page
    assert not WorkflowRun.objects.exists()
    response = client.post(url, {"target": "web", "retries": "3", "note": ""})
    run = WorkflowRun.objects.get()
    assert response.url == f"/app/runs/{run.pk}/"
    assert run.parameters == {"target": "web", "retries": 3, "note": "hello"}


def test_only_the_owner_may_start_a_run(alice):
    workflow = make_workflow(alice, SOURCE)
    viewer = logged_in(with_perms("vic", "view_workflow", "view_workflowrun"))
    assert viewer.get(f"/app/workflows/{workflow.pk}/").status_code == 200
    assert viewer.post(f"/app/workflows/{workflow.pk}/run/", {"target": "x"}).status_code == 403
    assert not WorkflowRun.objects.exists()


@pytest.fixture
def waiting(alice):
    return waiting_at_gate(engine.create_run(make_workflow(alice, SOURCE), {"target": "web"}))


def test_an_approver_answers_on_the_run_page(waiting):
    approver = logged_in(with_perms("ann", "approve_steprun", "view_workflowrun"))
    page = approver.get(f"/app/runs/{waiting.run_id}/").content.decode()
    assert "gate</strong> waits for an answer: Deploy it?" in page and ">Approve</button>" in page
    assert (
        "After <strong>a</strong> (success), whose outputs are" in page and "&quot;changes&quot;: 3" in page
    )
    response = approver.post(f"/app/runs/{waiting.run_id}/steps/gate/approve/", follow=True)
    assert "Approved: gate." in response.content.decode()
    waiting.refresh_from_db()
    assert (waiting.status, waiting.decision, waiting.decided_by.username) == ("success", "approved", "ann")


def test_without_the_permission_there_is_no_button_and_the_server_refuses(waiting):
    viewer = logged_in(with_perms("vic", "view_workflowrun"))
    page = viewer.get(f"/app/runs/{waiting.run_id}/").content.decode()
    assert ">Approve</button>" not in page and "someone who may approve must answer it" in page
    assert viewer.post(f"/app/runs/{waiting.run_id}/steps/gate/approve/").status_code == 403
    waiting.refresh_from_db()
    assert waiting.status == "in-progress"


def test_the_live_part_stops_asking_once_the_run_is_complete(waiting, alice):
    owner = logged_in(alice)
    live = owner.get(f"/app/runs/{waiting.run_id}/live/").content.decode()
    assert 'hx-trigger="load, again"' in live and ">Cancel run</button>" in live
    version = re.search(r'"X-Live-Version": "(\w+)"', live).group(1)
    with CaptureQueriesContext(connection) as queries:
        unchanged = owner.get(f"/app/runs/{waiting.run_id}/live/", headers={"X-Live-Version": version})
    assert unchanged.status_code == 204  # nothing to swap: htmx leaves the page (and its focus) alone
    # Without the server's loop (pages.live), each ask is Django's: the session, the user, the
    # run (as the user may see it) and its version.
    assert len(queries) == 4, [q["sql"] for q in queries.captured_queries]
    owner.post(f"/app/runs/{waiting.run_id}/cancel/")
    engine.advance(waiting.run_id)
    live = owner.get(
        f"/app/runs/{waiting.run_id}/live/", headers={"X-Live-Version": version}
    ).content.decode()
    assert "hx-trigger" not in live and "cancelled" in live and "Cancel run" not in live
    assert steps_of(waiting.run)["deploy"].status == "skipped"


SPEC_SOURCE = f"""apiVersion: v1
parameters:
  target:
    default: web
steps:
- name: a
  image: {NOOP}
  spec:
    outputs: {{ticket: TICKET-12345, changes: 3}}
- name: b
  image: {NOOP}
  dependsOn: a
  spec:
    target: !Parameter target
    token: !Secret apiToken
    header: !Fn.concat ["Bearer ", !Secret apiToken]
    ticket: !Output [a, ticket]
- name: c
  image: {NOOP}
  dependsOn: a
  when: !Fn.equals [!Parameter target, nowhere]
"""


def test_a_step_s_part_says_why_and_shows_outputs_and_its_spec_with_secrets_masked(alice, bao):
    from workflows.models import StepRun, WorkflowSecret

    workflow = make_workflow(alice, SPEC_SOURCE)
    WorkflowSecret.put(workflow, "apiToken", "s3cret-token-value", alice)
    run = engine.create_run(workflow, {}, created_by=alice)
    engine.start_run(run.pk)
    engine.start_step(str(steps_of(run)["a"].pk))
    client = logged_in(alice)
    part = client.get(f"/app/runs/{run.pk}/steps/b/").content.decode()
    assert "s3cret" not in part
    assert (
        "&quot;token&quot;: &quot;***&quot;" in part and "&quot;header&quot;: &quot;Bearer ***&quot;" in part
    )
    assert (
        "&quot;target&quot;: &quot;web&quot;" in part
        and "&quot;ticket&quot;: &quot;TICKET-12345&quot;" in part
    )
    part = client.get(f"/app/runs/{run.pk}/steps/a/").content.decode()
    assert "<h4>Outputs</h4>" in part and "TICKET-12345" in part

    # An output marked sensitive is masked in its step's outputs and in the specs that read it.
    StepRun.objects.filter(run=run, name="a").update(output_metadata={"ticket": {"sensitive": True}})
    assert "TICKET-12345" not in client.get(f"/app/runs/{run.pk}/steps/a/").content.decode()
    part = client.get(f"/app/runs/{run.pk}/steps/b/").content.decode()
    assert "TICKET-12345" not in part and "&quot;ticket&quot;: &quot;***&quot;" in part

    engine.start_step(str(steps_of(run)["c"].pk))
    part = client.get(f"/app/runs/{run.pk}/steps/c/").content.decode()
    assert '<dd class="why">Skipped: ' in part
    assert client.get(f"/app/runs/{run.pk}/steps/nope/").status_code == 404
    assert logged_in(User.objects.create_user("bob")).get(f"/app/runs/{run.pk}/steps/b/").status_code == 404


def test_a_complete_run_is_deleted_after_a_page_that_says_what_goes_with_it(alice):
    run = engine.create_run(make_workflow(alice, SOURCE), {"target": "web"}, created_by=alice)
    client = logged_in(alice)
    url = f"/app/runs/{run.pk}/delete/"
    assert "Delete this run" not in client.get(f"/app/runs/{run.pk}/").content.decode()
    response = client.post(url, follow=True)  # not complete: refused, kept
    assert "cancel it first" in response.content.decode() and WorkflowRun.objects.filter(pk=run.pk).exists()

    run.finish("failure")
    assert f'href="{url}"' in client.get(f"/app/runs/{run.pk}/").content.decode()
    page = client.get(url).content.decode()
    assert "<li>3 step runs</li>" in page and "Yes, delete it" in page
    viewer = logged_in(with_perms("vic", "view_workflowrun"))
    assert f'href="{url}"' not in viewer.get(f"/app/runs/{run.pk}/").content.decode()
    assert viewer.get(url).status_code == 403 and viewer.post(url).status_code == 403
    deleter = logged_in(with_perms("dee", "view_workflowrun", "delete_workflowrun"))
    response = deleter.post(url)
    assert response.url == f"/app/workflows/{run.workflow_id}/"
    assert not WorkflowRun.objects.filter(pk=run.pk).exists()


def test_the_admin_shows_a_run_without_save_and_delete_only_to_who_may_once_complete(alice):
    alice.is_staff = True
    alice.save()
    run = engine.create_run(make_workflow(alice, SOURCE), {"target": "web"}, created_by=alice)
    owner = logged_in(alice)
    url = f"/admin/workflows/workflowrun/{run.pk}/change/"
    page = owner.get(url).content.decode()
    assert 'name="_save"' not in page and 'name="_continue"' not in page and "/delete/" not in page
    run.finish("success")
    page = owner.get(url).content.decode()
    assert 'name="_save"' not in page and 'name="_continue"' not in page
    assert f"/admin/workflows/workflowrun/{run.pk}/delete/" in page
    viewer = logged_in(with_perms("vic", "view_workflowrun"))
    page = viewer.get(url).content.decode()
    assert 'name="_save"' not in page and "/delete/" not in page
    assert viewer.post(f"/admin/workflows/workflowrun/{run.pk}/delete/", {"post": "yes"}).status_code == 403
    page = owner.get(f"/admin/workflows/workflowrun/{run.pk}/delete/").content.decode()
    assert "Step run" in page  # what goes with it
    owner.post(f"/admin/workflows/workflowrun/{run.pk}/delete/", {"post": "yes"})
    assert not WorkflowRun.objects.filter(pk=run.pk).exists()


def test_a_puppet_step_s_part_links_its_puppet_run_with_nodes_outcome_and_what_would_change(
    alice, connection
):
    from runs.models import Run
    from workflows.models import StepRun

    puppet = Run.create_for(connection[0], {"noop": True, "scope": {"nodes": ["web-1"]}})
    Run.objects.filter(pk=puppet.pk).update(status="complete", outcome="success")
    run = engine.create_run(make_workflow(alice, SOURCE), {"target": "web"}, created_by=alice)
    nodes = [
        {
            "name": "web-1",
            "changes_pending": True,
            "resources": [{"type": "File", "title": "/etc/motd", "changes": [{"property": "content"}]}],
        }
    ]
    StepRun.objects.filter(run=run, name="a").update(
        status="success", outputs={"id": str(puppet.pk), "results": {"nodes": nodes}}
    )
    part = logged_in(alice).get(f"/app/runs/{run.pk}/steps/a/").content.decode()
    assert f'<a href="/admin/runs/run/{puppet.pk}/change/">{puppet.pk}</a>' in part
    assert "dry run (noop)" in part and "status-success" in part
    assert "&quot;web-1&quot;" in part  # its nodes
    assert "<strong>web-1</strong>: changes pending<br>File[/etc/motd] content" in part


CONNECTED = f"""apiVersion: v1
triggers:
- name: reports
  source: {{type: push}}
- name: merged
  source:
    type: webhook
    image: relaysh/stdlib-trigger-json
- name: nightly
  source: {{type: schedule, schedule: '0 3 * * *'}}
steps:
- name: deploy
  image: {NOOP}
  spec:
    connection: ${{connections.puppet['prod']}}
    other: !Connection {{type: puppet, name: staging}}
    slack: !Connection {{type: slack, name: team}}
"""


def test_the_workflow_page_says_how_to_send_each_trigger_s_events_never_the_token(alice, settings):
    from triggers.models import Trigger

    settings.RELAY_PUBLIC_URL = "https://relay.example.com"
    workflow = make_workflow(alice, CONNECTED)
    push, hook = Trigger.objects.get(name="reports"), Trigger.objects.get(name="merged")
    page = logged_in(alice).get(f"/app/workflows/{workflow.pk}/").content.decode()
    section = page[page.index('id="trigger-reports"') : page.index('id="trigger-merged"')]
    placeholder = f"&lt;the token of trigger reports, {push.token_prefix}…&gt;"
    assert "Its events go to <code>https://relay.example.com/api/events</code>" in section
    assert (
        "reports = relay\n\n# /etc/puppetlabs/puppet/relay.yaml" in section
        and "relay_api_url: https://relay.example.com/\n" in section
        and f"relay_trigger_token: &quot;{placeholder}&quot;\n" in section
    )
    assert f"reporturl = https://any:{placeholder}@relay.example.com/api/events\n" in section
    section = page[page.index('id="trigger-merged"') : page.index('id="trigger-nightly"')]
    assert (
        f"export RELAY_TRIGGER_TOKEN=&#x27;&lt;the token of trigger merged, {hook.token_prefix}…&gt;&#x27;"
        in section
    )
    assert f"  https://relay.example.com/api/webhooks/{hook.pk}/\n" in section
    assert '"Authorization: Bearer $RELAY_TRIGGER_TOKEN"'.replace('"', "&quot;") in section
    section = page[page.index('id="trigger-nightly"') :]
    assert re.search(
        r"<code>0 3 \* \* \*</code> \(cron, UTC\); next at "
        r"<time datetime=\"[0-9T:-]+Z\">[0-9 :-]+ UTC</time>\.",
        section,
    )
    assert re.search(r"rly[a-z]_[0-9A-Za-z]{61}", page) is None  # no token anywhere


def test_only_who_may_change_a_trigger_gets_its_settings(alice):
    workflow = make_workflow(alice, CONNECTED)
    viewer = logged_in(with_perms("vic", "view_workflow"))
    page = viewer.get(f"/app/workflows/{workflow.pk}/").content.decode()
    assert 'id="trigger-reports"' in page and "/api/events</code>" in page  # where events go
    assert "relay_trigger_token" not in page and "RELAY_TRIGGER_TOKEN" not in page


def test_the_workflow_page_lists_the_connections_its_steps_name_and_links_to_make_a_missing_one(alice, staff):
    from puppet_connection.models import PuppetConnection

    alice.is_staff = True
    alice.save()
    alice.user_permissions.set(Permission.objects.filter(codename="add_puppetconnection"))
    prod, _ = PuppetConnection.create_with_token(owner=alice, name="prod")
    workflow = make_workflow(alice, CONNECTED)
    page = logged_in(User.objects.get(pk=alice.pk)).get(f"/app/workflows/{workflow.pk}/").content.decode()
    rows = {
        name: page[page.index(f'id="connection-{name}"') :].split("</tr>")[0]
        for name in ("puppet-prod", "puppet-staging", "slack-team")
    }
    assert (
        f'<a href="/admin/puppet_connection/puppetconnection/{prod.pk}/change/">prod</a>'
        in rows["puppet-prod"]
    )
    assert "exists" in rows["puppet-prod"] and "missing" not in rows["puppet-prod"]
    assert (
        '<a class="button" href="/admin/puppet_connection/puppetconnection/add/?name=staging">'
        "Create the puppet connection staging</a>" in rows["puppet-staging"]
    )
    # No permission to add a Slack connection in the admin: the API, said in words.
    assert "missing" in rows["slack-team"] and "<a " not in rows["slack-team"]
    assert (
        "You can make it with the API: POST /api/connections/slack/ with the name team." in rows["slack-team"]
    )
    # A superuser makes it for the owner: the owner filled in too.
    page = logged_in(staff).get(f"/app/workflows/{workflow.pk}/").content.decode()
    assert f"/admin/connections/slackconnection/add/?name=team&amp;owner={alice.pk}" in page
    # The form it links to has the name filled in.
    form = logged_in(staff).get(f"/admin/connections/slackconnection/add/?name=team&owner={alice.pk}")
    assert 'name="name" value="team"' in form.content.decode()


def test_an_approval_shows_what_the_dry_run_before_it_would_change_or_why_that_is_not_known(waiting):
    results = {
        "nodes": [
            {
                "name": "web-1",
                "changes_pending": True,
                "resources": [
                    {
                        "type": "File",
                        "title": "/etc/motd",
                        "changes": [{"property": "content", "from": "a", "to": "b"}],
                    }
                ],
            },
            {
                "name": "web-2",
                "changes_pending": None,
                "report_error": "not available: PuppetDB at x could not be reached",
            },
        ]
    }
    StepRun.objects.filter(run_id=waiting.run_id, name="a").update(outputs={"results": results})
    approver = logged_in(with_perms("ann", "approve_steprun", "view_workflowrun"))
    page = approver.get(f"/app/runs/{waiting.run_id}/").content.decode()
    assert "After <strong>a</strong> (success), which would change:" in page
    assert "<strong>web-1</strong>: changes pending<br>File[/etc/motd] content: a → b" in page
    assert "<strong>web-2</strong>: not available: PuppetDB at x could not be reached" in page


def test_a_step_name_cannot_break_out_of_the_picture_s_markup(alice):
    # Graphviz escapes a node's label, id and tooltip, but writes its URL into the SVG's href
    # as given: a step named to close the attribute would add its own to the page.
    name = 'a" onmouseover="alert(1)" x="%'
    source = f"apiVersion: v1\nsteps:\n- name: '{name}'\n  type: approval\n"
    page = logged_in(alice).get(f"/app/workflows/{make_workflow(alice, source).pk}/").content.decode()
    svg = page[page.index("<svg") : page.index("</svg>")]
    assert 'onmouseover="alert(1)"' not in svg
    assert 'href="#step-a%22%20onmouseover%3D%22alert%281%29%22%20x%3D%22%25"' in svg  # run.js decodes it


def test_an_unknown_status_filter_is_a_400_in_plain_text_not_markup(alice):
    workflow = make_workflow(alice, SOURCE)
    response = logged_in(alice).get(f"/app/workflows/{workflow.pk}/", {"status": "<script>alert(1)</script>"})
    assert response.status_code == 400
    assert response["Content-Type"] == "text/plain; charset=utf-8"  # not markup a browser runs
    assert "one of initializing, in-progress" in response.content.decode()


def test_a_trigger_s_name_stays_inside_its_quotes_in_the_settings_to_paste(db, settings):
    import shlex

    import yaml

    from triggers import setup
    from triggers.models import Trigger

    # Only its length is checked (it comes from the document): the owner names it, someone
    # else (a superuser) may paste the snippet.
    name = "x' \"$(touch /tmp/pwned)\" '\nreports: evil"
    hook = Trigger(name=name, kind="webhook", token_lookup="abc")
    [export, _] = setup.webhook_curl(hook).split("\ncurl", 1)
    assert shlex.split(export) == ["export", f"RELAY_TRIGGER_TOKEN={setup.token_placeholder(hook)}"]
    push = Trigger(name=name, kind="push", token_lookup="abc")
    written = yaml.safe_load(setup.report_processor_settings(push).split("\n\n")[1])
    assert written == {
        "relay_api_url": f"{settings.RELAY_PUBLIC_URL}/",
        "relay_trigger_token": setup.token_placeholder(push),
    }
    assert setup.http_processor_settings(push).count("\n") == 3  # no line of its own in puppet.conf


def test_a_post_to_the_admin_s_page_of_a_run_in_progress_writes_nothing_back(alice):
    # Every field is read-only and there is no Save button, but a POST of the form saved the
    # row as it was read, undoing whatever a worker wrote since.
    alice.is_staff = True
    alice.save()
    run = engine.create_run(make_workflow(alice, SOURCE), {"target": "web"}, created_by=alice)
    owner = logged_in(alice)
    url = f"/admin/workflows/workflowrun/{run.pk}/change/"
    with CaptureQueriesContext(connection) as queries:
        response = owner.post(url, {})
    assert response.status_code == 405
    written = [q["sql"] for q in queries if q["sql"].startswith('UPDATE "workflows_workflowrun"')]
    assert written == []


def test_a_parameter_the_api_would_refuse_as_json_is_the_field_s_error_not_a_500(alice):
    workflow = make_workflow(alice, SOURCE)
    url = f"/app/workflows/{workflow.pk}/run/"
    client = logged_in(alice)
    for bad in ("[" * 100_000, "[" * 900 + "]" * 900, "NaN", "1e400"):
        page = client.post(url, {"target": "web", "retries": bad}).content.decode()
        assert '<ul class="errorlist" id="id_retries-errors"><li>Not a number: write it as JSON' in page
    assert not WorkflowRun.objects.exists()
