"""The fleet inventory from the bridge's side (issue 21 §3): `relay-bridge poll --once` and
`relay-bridge inventory` read the session's real PuppetDB (tests/puppetdb.py) and send the
connection's nodes to the live service over `/_puppet/inventory`, full then incremental,
with only the allow-list's facts. PuppetDB holds every test's nodes; each test names its
own by a prefix and looks only at those."""

import signal
import subprocess
import uuid
from pathlib import Path

import pytest
import requests
import yaml
from relay_bridge import inventory
from relay_bridge.puppetdb import PuppetDB as Client

from inventory.models import Inventory, Node
from puppet_connection.models import PuppetConnection
from tests.bao import free_port
from tests.bridge_helpers import RELAY_BRIDGE, Service, relay_bridge, wait_for
from tests.puppetdb import PuppetDB

pytestmark = pytest.mark.django_db(transaction=True)


def facts(name: str, family: str = "Debian") -> dict:
    return {
        "os": {"family": family, "release": {"full": "12.4", "major": "12"}},
        "kernel": "Linux",
        "networking": {"fqdn": f"{name}.example.com", "ip": "10.0.0.1"},
        "puppetversion": "7.23.0",
        "secret_token": "s3cret-never-leaves",
        "fleet": name.split("-")[0],
    }


def config(tmp_path, service: Service, puppetdb_url: str, **keys) -> str:
    path = tmp_path / "bridge.yaml"
    values = {
        "relay_api_url": service.url,
        "relay_connection_token": service.token,
        "backend": "ssh",
        "state_dir": str(tmp_path / "state"),
        "puppetdb_url": puppetdb_url,
        **keys,
    }
    path.write_text(yaml.safe_dump(values))
    return str(path)


def bridge(path: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [RELAY_BRIDGE, "--config", path, *args], capture_output=True, text=True, timeout=120, check=False
    )


def ours(prefix: str) -> dict[str, Node]:
    return {n.certname: n for n in Node.objects.filter(certname__startswith=f"{prefix}-")}


def test_poll_once_sends_the_fleet_with_only_the_allow_lists_facts(oss, puppetdb: PuppetDB, tmp_path):
    for n in range(3):
        puppetdb.replace_facts(f"inva-{n}", facts(f"inva-{n}", "RedHat" if n == 2 else "Debian"))
    puppetdb.store_report("inva-0", status="failed")
    path = config(tmp_path, oss, puppetdb.url)
    done = bridge(path, "poll", "--once")
    assert done.returncode == 0, done.stderr

    nodes = ours("inva")
    assert set(nodes) == {"inva-0", "inva-1", "inva-2"}
    assert nodes["inva-0"].facts == {
        "os.family": "Debian",
        "os.release.full": "12.4",
        "kernel": "Linux",
        "networking.fqdn": "inva-0.example.com",
        "puppetversion": "7.23.0",
    }
    assert (nodes["inva-0"].report_status, nodes["inva-0"].state) == ("failed", "active")
    assert (nodes["inva-1"].report_status, nodes["inva-1"].state) == ("", "stale")  # no report yet
    assert nodes["inva-2"].facts["os.family"] == "RedHat"
    assert not Node.objects.filter(facts__icontains="s3cret").exists()
    inventory_row = Inventory.objects.get()
    assert inventory_row.fact_paths == list(inventory.DEFAULT_FACTS)
    assert inventory_row.full_synced_at and inventory_row.since


def test_the_next_sync_sends_only_what_changed_and_the_deactivated(oss, puppetdb: PuppetDB, tmp_path):
    for n in range(3):
        puppetdb.replace_facts(f"invb-{n}", facts(f"invb-{n}"))
    path = config(tmp_path, oss, puppetdb.url, inventory_facts=["os.family", "fleet"])
    first = bridge(path, "inventory")
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("full sync")
    assert ours("invb")["invb-0"].facts == {"os.family": "Debian", "fleet": "invb"}
    # Incremental syncs ask from 30 s before the last one began: move that back, as if later.
    Inventory.objects.update(since="2000-01-01T00:00:00+00:00")
    everything = bridge(path, "inventory")
    assert everything.stdout.startswith("incremental sync")
    sent_all = int(everything.stdout.split()[2])

    Inventory.objects.update(since=puppetdb_now(puppetdb))
    puppetdb.replace_facts("invb-1", {**facts("invb-1"), "os": {"family": "Suse"}})
    puppetdb.store_report("invb-2", status="changed")
    deactivate(puppetdb, "invb-0")
    again = bridge(path, "inventory")
    assert again.returncode == 0, again.stderr
    sent = int(again.stdout.split()[2])
    assert 3 <= sent < sent_all  # the changed ones, and every deactivated node PuppetDB has
    nodes = ours("invb")
    assert nodes["invb-1"].facts["os.family"] == "Suse"
    assert nodes["invb-2"].report_status == "changed"
    assert nodes["invb-0"].state == "deactivated"


def test_odd_certnames_in_puppetdb_are_refused_by_name_and_the_rest_kept(oss, puppetdb: PuppetDB, tmp_path):
    puppetdb.replace_facts("invc-ok", facts("invc-ok"))
    puppetdb.replace_facts("INVC-Upper", facts("invc-upper"))
    path = config(tmp_path, oss, puppetdb.url)
    done = bridge(path, "inventory")
    assert done.returncode == 0, done.stderr
    assert "refused" in done.stdout and " 0 refused" not in done.stdout
    assert "INVC-Upper" in done.stderr  # the bridge's log names it
    assert set(ours("invc")) == {"invc-ok"}


def test_puppetdb_down_fails_the_sync_clearly_and_loses_nothing(oss, puppetdb: PuppetDB, tmp_path):
    puppetdb.replace_facts("invd-0", facts("invd-0"))
    good = config(tmp_path, oss, puppetdb.url)
    assert bridge(good, "inventory").returncode == 0
    kept = Inventory.objects.get().since

    down = tmp_path / "down"
    down.mkdir()
    done = bridge(config(down, oss, f"http://127.0.0.1:{free_port()}"), "inventory")
    assert done.returncode == 1
    assert "could not be reached" in done.stderr
    row = Inventory.objects.get()
    assert (row.since, row.sync_id) == (kept, None)
    assert "could not be reached" in row.last_error
    assert "invd-0" in ours("invd")
    # A poll still works its runs while PuppetDB is down: the sync's failure is only logged.
    assert bridge(config(down, oss, f"http://127.0.0.1:{free_port()}"), "poll", "--once").returncode == 0


def test_pages_stream_every_node_once_with_its_facts(puppetdb: PuppetDB):
    for n in range(11):
        puppetdb.replace_facts(f"inve-{n:02}", facts(f"inve-{n:02}"))
    client = Client(puppetdb.url)
    seen: list[str] = []
    sizes = []
    for page in inventory.pages(client, None, ("os.release.full", "networking.fqdn"), size=30):
        sizes.append(len(page))
        seen += [n["certname"] for n in page if n["certname"].startswith("inve-")]
        for node in page:
            if node["certname"].startswith("inve-"):
                assert node["facts"] == {
                    "os.release.full": "12.4",
                    "networking.fqdn": f"{node['certname']}.example.com",
                }
    assert seen == [f"inve-{n:02}" for n in range(11)]
    assert max(sizes) <= 30
    assert len(sizes) > 1 or sum(sizes) <= 30


@pytest.mark.parametrize("size", [10, 25])
def test_pages_smaller_than_their_overlap_still_move_on(puppetdb: PuppetDB, size):
    """The service sets the page size: one at or under PAGE_OVERLAP nodes asked PuppetDB
    from a negative offset (a 400), or at 25 the same page for ever."""
    for n in range(60):
        puppetdb.replace_facts(f"invp-{n:02}", facts(f"invp-{n:02}"))

    class Counted(Client):
        asked = 0

        def query(self, *args, **kwargs):
            self.asked += 1
            assert self.asked < 1_000, "the pages never end"
            return super().query(*args, **kwargs)

    client = Counted(puppetdb.url)
    seen: list[str] = []
    for page in inventory.pages(client, None, (), size=size):
        assert len(page) <= size
        seen += [n["certname"] for n in page if n["certname"].startswith("invp-")]
    assert seen == [f"invp-{n:02}" for n in range(60)]


def test_the_serve_timer_syncs_when_the_service_asks(oss, puppetdb: PuppetDB):
    puppetdb.replace_facts("invf-0", facts("invf-0"))
    client = Client(puppetdb.url)
    timer = inventory.Timer(oss.client, client, ("kernel",), interval=3600)
    timer.tick()  # the first: at start
    assert "invf-0" in ours("invf")
    puppetdb.replace_facts("invf-1", facts("invf-1"))
    timer.tick()
    assert "invf-1" not in ours("invf")  # not due
    Inventory.objects.get().request_sync()
    timer.tick()
    assert "invf-1" in ours("invf")
    assert Inventory.objects.get().sync_requested_at is None


def deactivate(puppetdb: PuppetDB, certname: str) -> None:
    answer = requests.post(
        f"{puppetdb.url}/pdb/cmd/v1",
        params={
            "command": "deactivate node",
            "version": 3,
            "certname": certname,
            "secondsToWaitForCompletion": 30,
        },
        json={"certname": certname, "producer_timestamp": puppetdb_now(puppetdb)},
        timeout=60,
    )
    answer.raise_for_status()


def puppetdb_now(puppetdb: PuppetDB) -> str:
    client = Client(puppetdb.url)
    client.query(["=", "certname", str(uuid.uuid4())], "nodes")
    return client.clock.isoformat()


BASE_CONFIG = {"RELAY_API_URL": "https://relay.example", "RELAY_CONNECTION_TOKEN": "rlyp_x"}


def test_the_allow_list_defaults_with_puppetdb_and_takes_a_list_or_comma_separated_text(tmp_path):
    from relay_bridge.config import load

    empty = tmp_path / "none.yaml"
    empty.write_text("{}")
    assert load(empty, BASE_CONFIG).inventory_facts == ()
    with_db = {**BASE_CONFIG, "RELAY_PUPPETDB_URL": "http://localhost:8080"}
    assert load(empty, with_db).inventory_facts == inventory.DEFAULT_FACTS
    given = load(empty, {**with_db, "RELAY_INVENTORY_FACTS": "os.family, fleet,os.family"})
    assert given.inventory_facts == ("os.family", "fleet")
    listed = tmp_path / "listed.yaml"
    listed.write_text("inventory_facts: [kernel, networking.ip]\ninventory_interval: 0\n")
    config = load(listed, with_db)
    assert (config.inventory_facts, config.inventory_interval) == (("kernel", "networking.ip"), 0)


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("inventory_facts: [kernel]\n", "inventory_facts: is for puppetdb_url"),
        ("puppetdb_url: http://x:8080\ninventory_facts: ['os..family']\n", "is not a dotted fact path"),
        ("puppetdb_url: http://x:8080\ninventory_facts: {a: 1}\n", "must be a list"),
        ("puppetdb_url: http://x:8080\ninventory_interval: 5\n", "inventory_interval: must be 0"),
        ("puppetdb_url: https://relay:s3cret@x:8081\n", "puppetdb_url: must not hold a user or password"),
    ],
)
def test_an_invalid_inventory_configuration_exits_2_naming_the_key(tmp_path, yaml_text, message):
    path = tmp_path / "bridge.yaml"
    path.write_text("relay_api_url: https://relay.example\nrelay_connection_token: rlyp_x\n" + yaml_text)
    done = bridge(str(path), "--state-dir", str(tmp_path / "state"), "inventory")
    assert done.returncode == 2
    assert message in done.stderr


def test_relay_bridge_inventory_without_puppetdb_exits_2(tmp_path):
    path = tmp_path / "bridge.yaml"
    path.write_text("relay_api_url: https://relay.example\nrelay_connection_token: rlyp_x\nbackend: ssh\n")
    done = bridge(str(path), "--state-dir", str(tmp_path / "state"), "inventory")
    assert (done.returncode, done.stderr.strip()) == (
        2,
        "relay-bridge: invalid configuration: puppetdb_url: is not set",
    )


def test_serve_syncs_at_start_and_stops_cleanly(oss, puppetdb: PuppetDB, tmp_path):
    puppetdb.replace_facts("invg-0", facts("invg-0"))
    path = config(tmp_path, oss, puppetdb.url, inventory_interval=3600)
    server = relay_bridge(Path(path), "serve", "--wait", "2", log=tmp_path / "bridge.log")
    log = tmp_path / "bridge.log"
    try:
        wait_for(lambda: "inventory synced" in log.read_text(), 60, "a sync at serve's start")
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(15) == 0
    assert "invg-0" in ours("invg")
    assert Inventory.objects.get().sync_id is None  # ended, not left half way


def test_a_query_preview_is_resolved_by_the_bridge_through_puppetdb(oss, puppetdb: PuppetDB, tmp_path):
    from inventory.scope import ASKED, preview

    for n, family in enumerate(["Debian", "RedHat", "Debian"]):
        puppetdb.replace_facts(f"invh-{n}", {**facts(f"invh-{n}", family), "fleet": "invh"})
    connection = PuppetConnection.objects.get()
    query = {"query": 'inventory[certname] { facts.fleet = "invh" and facts.os.family = "Debian" }'}
    bad = {"query": "inventory[certname] { facts.fleet = }"}
    assert preview(connection, query)["flags"] == [ASKED]
    assert preview(connection, bad)["flags"] == [ASKED]
    done = bridge(config(tmp_path, oss, puppetdb.url), "inventory")
    assert done.returncode == 0, done.stderr
    shown = preview(connection, query)
    assert (shown["resolved"], [n["certname"] for n in shown["nodes"]]) == (True, ["invh-0", "invh-2"])
    assert shown["unknown"] == []  # the same sync sent them
    refused = preview(connection, bad)
    assert refused["flags"][0].startswith("PuppetDB could not resolve it: PuppetDB refused the query (400)")


def test_wide_preview_answers_are_sent_one_by_one_and_one_over_the_bound_says_so(
    oss, puppetdb: PuppetDB, settings
):
    """The bridge sent every answer in one request: over the service's body bound (413)
    none was taken, and the same batch failed again each minute."""
    from inventory.scope import QUERY_FAILED, preview

    for n in range(20):
        puppetdb.replace_facts(f"invq-a-rather-long-certname-{n:02}", {**facts("invq"), "fleet": "invq"})
    connection = PuppetConnection.objects.get()
    narrow = [
        {"query": f'inventory[certname] {{ certname = "invq-a-rather-long-certname-{n:02}" }}'}
        for n in (0, 1)
    ]
    wide = {"query": 'inventory[certname] { facts.fleet = "invq" }'}
    for scope in (*narrow, wide):
        preview(connection, scope)
    settings.API_MAX_BODY_BYTES = 250  # one narrow answer fits, two do not, nor the wide one

    assert inventory.answer_queries(oss.client, Client(puppetdb.url), oss.client.inventory_status()) == 3
    for n, scope in enumerate(narrow):
        assert [row["certname"] for row in preview(connection, scope)["nodes"]] == [
            f"invq-a-rather-long-certname-{n:02}"
        ]
    assert preview(connection, wide)["flags"] == [
        f"{QUERY_FAILED}: the query names 20 nodes: over the service's body bound"
    ]


def test_a_page_the_service_refuses_ends_the_sync_failed_not_left_under_way(
    oss, puppetdb: PuppetDB, settings
):
    """A node over the service's page bound (413) left the sync under way: every sync was
    then refused (409) until INVENTORY_SYNC_IDLE had passed, with no error to show."""
    puppetdb.replace_facts("invr-0", facts("invr-0"))
    settings.INVENTORY_PAGE_MAX_BYTES = 100  # under any one node
    with pytest.raises(inventory.InventoryError, match="the service refused a page"):
        inventory.sync(oss.client, Client(puppetdb.url))
    row = Inventory.objects.get()
    assert row.sync_id is None
    assert "413" in row.last_error
