"""The bridge's PuppetDB client (relay_bridge.puppetdb) against the session's real PuppetDB
(tests/puppetdb.py), over its cleartext port and over TLS with puppetserver's certificates."""

import pytest
from relay_bridge.puppetdb import PuppetDB as Client
from relay_bridge.puppetdb import PuppetDBError

from tests.puppetdb import PuppetDB


@pytest.fixture(scope="module")
def fleet(puppetdb: PuppetDB) -> list[str]:
    """Synthetic nodes fed through PuppetDB's command API: three Debian, one RedHat."""
    names = [f"pdbclient-{n}.example.com" for n in range(4)]
    for n, name in enumerate(names):
        family = "RedHat" if n == 3 else "Debian"
        puppetdb.replace_facts(name, {"os": {"family": family}, "kernel": "Linux", "role": f"r{n}"})
        puppetdb.store_report(name, status="changed" if n == 0 else "unchanged")
    return names


def test_the_session_puppetdb_started(puppetdb: PuppetDB) -> None:
    print(
        f"\nPuppetDB answered {puppetdb.start_seconds:.1f} s after it was started (cached: {puppetdb.cached})"
    )
    assert puppetdb.process and puppetdb.process.poll() is None


def test_pql_over_cleartext(puppetdb: PuppetDB, fleet: list[str]) -> None:
    client = Client(puppetdb.url)
    names = client.certnames(
        'inventory[certname] { facts.os.family = "Debian" and certname ~ "^pdbclient-" }'
    )
    assert sorted(names) == fleet[:3]


def test_ast_over_tls_with_client_certificates(puppetdb: PuppetDB, fleet: list[str]) -> None:
    ssl = puppetdb.ssl_dir
    client = Client(
        puppetdb.ssl_url,
        str(ssl / "certs/localhost.pem"),
        str(ssl / "private_keys/localhost.pem"),
        str(puppetdb.ca()),
    )
    names = client.certnames(["and", ["=", ["fact", "role"], "r3"], ["~", "certname", "^pdbclient-"]])
    assert names == [fleet[3]]
    assert client.certnames(["from", "nodes", ["=", ["fact", "role"], "r0"]]) == [fleet[0]]


def test_tls_without_a_client_certificate_is_refused(puppetdb: PuppetDB, fleet: list[str]) -> None:
    client = Client(puppetdb.ssl_url, cacert=str(puppetdb.ca()))
    with pytest.raises(PuppetDBError, match="could not be reached"):
        client.certnames("nodes[certname] {}")


def test_invalid_pql_gives_puppetdbs_message(puppetdb: PuppetDB, fleet: list[str]) -> None:
    with pytest.raises(PuppetDBError, match=r"PuppetDB refused the query \(400\): .+") as raised:
        Client(puppetdb.url).certnames("inventory[certname] { facts.os.family = }")
    print(raised.value)


def test_a_query_without_certnames_is_refused(puppetdb: PuppetDB, fleet: list[str]) -> None:
    with pytest.raises(PuppetDBError, match="no certname"):
        Client(puppetdb.url).certnames('facts[value] { name = "kernel" }')


def test_an_answer_over_the_bound_is_refused_not_read_whole(puppetdb: PuppetDB, fleet: list[str]) -> None:
    """A query names what it returns (`inventory {}`: every node's every fact): past the
    client's bound its answer is refused, not read whole into the bridge's memory."""
    client = Client(puppetdb.url, max_bytes=500)
    with pytest.raises(PuppetDBError, match="over 500 bytes"):
        client.certnames('inventory { certname ~ "^pdbclient-" }')
    assert len(client.certnames('inventory[certname] { certname ~ "^pdbclient-" }')) == 4


def test_puppetdb_down_is_an_error(fleet: list[str]) -> None:
    from tests.bao import free_port

    with pytest.raises(PuppetDBError, match="could not be reached"):
        Client(f"http://127.0.0.1:{free_port()}", timeout=5).certnames("nodes[certname] {}")


def test_a_real_agent_run_through_puppetserver_feeds_puppetdb(
    puppetserver, puppetdb: PuppetDB, tmp_path
) -> None:
    """puppet agent -t through the session's puppetserver with the PuppetDB terminus: the
    node's facts, catalog and report land in PuppetDB, where the bridge's client finds them."""
    puppetserver.use_puppetdb(puppetdb.ssl_url)
    target = tmp_path / "motd"
    puppetserver.manifest(f"node default {{ file {{ '{target}': content => 'from puppet' }} }}")
    try:
        done = puppetserver.agent_run()
    finally:
        puppetserver.manifest("node default { }")
    assert done.returncode == 2, done.stdout + done.stderr  # changes applied
    certname = puppetserver.certname()
    client = Client(puppetdb.url)
    assert client.certnames(
        f'inventory[certname] {{ certname = "{certname}" and facts.kernel = "Linux" }}'
    ) == [certname]
    [node] = client.query(["=", "certname", certname], "nodes")
    assert node["report_timestamp"] and node["catalog_timestamp"] and node["facts_timestamp"]
    assert node["latest_report_status"] == "changed"
    [event] = client.query(
        ["and", ["=", "certname", certname], ["=", "resource_type", "File"], ["=", "latest_report?", True]],
        "events",
    )
    assert (event["resource_title"], event["status"]) == (str(target), "success")
