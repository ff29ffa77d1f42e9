from pathlib import Path

import pytest
from relay_bridge import config
from relay_bridge.backends import make
from relay_bridge.backends.bolt import BoltBackend
from relay_bridge.backends.orchestrator import OrchestratorBackend
from relay_bridge.backends.ssh import SshBackend
from relay_bridge.config import ConfigError, load

TOKEN = "rlyp_" + "a" * 61
# relay.yaml files as puppetlabs-relay 2.5.1 renders them: its templates/settings.yaml.epp,
# through `puppet apply` (Puppet 7) with stdlib's to_yaml, byte for byte. The placeholders
# are replaced by the tests.
MODULE = Path(__file__).parent / "fixtures" / "module-relay-yaml"


def module_yaml(tmp_path: Path, name: str, **replace: str) -> Path:
    text = (MODULE / f"{name}.yaml").read_text().replace("rlyp_CONNECTIONTOKENPLACEHOLDER", TOKEN)
    for old, new in replace.items():
        text = text.replace(old, new)
    path = tmp_path / "relay.yaml"
    path.write_text(text)
    return path


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bridge.yaml"
    path.write_text(text)
    return path


def test_the_module_s_relay_yaml_keys_are_read(tmp_path):
    path = write(
        tmp_path,
        f"""
relay_api_url: https://api.relay.example.com
relay_connection_token: {TOKEN}
backend: ssh
backend_ssh_user: puppet
backend_ssh_parallelism: 20
proxy_host: proxy.example.com
proxy_port: 3128
state_dir: {tmp_path}/state
""",
    )
    config = load(path, environ={})
    assert config.relay_api_url == "https://api.relay.example.com/"
    assert config.relay_connection_token == TOKEN and config.backend == "ssh"
    assert config.options("ssh") == {"user": "puppet", "parallelism": 20}
    assert config.proxy_url == "http://proxy.example.com:3128"
    assert config.state_dir == tmp_path / "state"
    assert TOKEN not in repr(config)


def test_a_relay_yaml_the_module_rendered_for_bolt_is_taken_unchanged(tmp_path):
    settings = load(module_yaml(tmp_path, "bolt"), environ={})
    assert settings.relay_api_url == "http://relay.invalid:8000/" and settings.relay_connection_token == TOKEN
    assert settings.debug is True and settings.backend == "bolt"
    # The proxy's password, `@`, `:` and `/` in it, stays inside the URL's user part.
    assert settings.proxy_url == "http://relay:pr0xy%20p%40ss%3Aw%2Frd%25@127.0.0.1:3128"
    text = repr(settings)
    assert "rlyt_" not in text and "pr0xy" not in text and "b0lt" not in text and TOKEN not in text
    bolt = BoltBackend(settings.options("bolt"))
    assert bolt.bolt == ["/opt/puppetlabs/bin/bolt"]
    assert bolt.inventory() == {
        "version": 2,
        "config": {
            "ssh": {"user": "relay-automation", "password": "b0lt p@ss:w/rd", "host-key-check": False}
        },
    }


def test_a_relay_yaml_the_module_rendered_for_pe_is_taken_unchanged(tmp_path):
    settings = load(module_yaml(tmp_path, "orchestrator"), environ={})
    assert settings.backend == "orchestrator" and settings.debug is False and settings.proxy_url is None
    cacert = tmp_path / "ca.pem"  # the module reads Puppet's CA from Puppet's settings; so do we
    cacert.write_text("")
    orchestrator = OrchestratorBackend({**settings.options("orchestrator"), "cacert": str(cacert)})
    assert orchestrator.api_url == "https://pe.invalid:8143/orchestrator/v1"
    assert orchestrator.session.headers["X-Authentication"] == "RBACTOKENPLACEHOLDER"


# Every key of the module's settings (lib/puppet_x/relay/util/settings.rb, DEFAULTS), as a
# hand-written relay.yaml may hold them all, whichever backend it picks.
EVERY_MODULE_KEY = f"""
debug: false
test: true
relay_api_url: https://relay.example.com/
relay_connection_token: {TOKEN}
relay_trigger_token: rlyt_x
state_dir: {{state_dir}}
backend: {{backend}}
backend_orchestrator_api_url: https://pe.example.com:8143/orchestrator/v1/
backend_orchestrator_token: rbac
backend_bolt_command: [bolt]
backend_bolt_ssh_user: root
backend_bolt_ssh_password: secret
backend_bolt_ssh_host_key_check: true
backend_ssh_command: [ssh]
proxy_host: proxy.example.com
proxy_port: 3128
proxy_user: relay
proxy_password: secret
"""


@pytest.mark.parametrize("backend", ["orchestrator", "bolt", "ssh"])
def test_every_key_the_module_knows_is_taken(tmp_path, backend):
    path = write(tmp_path, EVERY_MODULE_KEY.format(state_dir=tmp_path / "state", backend=backend))
    (tmp_path / "ca.pem").write_text("")
    settings = load(path, environ={"RELAY_BACKEND_ORCHESTRATOR_CACERT": str(tmp_path / "ca.pem")})
    assert (settings.backend, settings.state_dir) == (backend, tmp_path / "state")
    assert make(settings, which=lambda name: None, pe=False).name == backend


def test_the_module_s_names_for_the_ssh_and_bolt_commands(tmp_path):
    ssh = SshBackend({"command": ["/usr/bin/ssh", "-F", "/etc/relay/ssh_config"]})
    assert ssh.ssh_argv("web1", "true")[:4] == ["/usr/bin/ssh", "-F", "/etc/relay/ssh_config", "-T"]
    assert ssh.ssh_argv("web1", "true")[-3:] == ["--", "web1", "true"]
    assert BoltBackend({"command": ["sudo", "-u", "bolt", "bolt"]}).bolt == ["sudo", "-u", "bolt", "bolt"]
    assert BoltBackend({"command": "/opt/bolt/bin/bolt"}).bolt == ["/opt/bolt/bin/bolt"]
    for options, key in (
        ({"command": ["ssh"], "openssh_client_path": "ssh"}, "backend_ssh_command"),
        ({"command": []}, "backend_ssh_command"),
    ):
        with pytest.raises(ConfigError) as caught:
            SshBackend(options)
        assert caught.value.key == key
    with pytest.raises(ConfigError) as caught:
        BoltBackend({"ssh_user": "a", "user": "b"})
    assert caught.value.key == "backend_bolt_ssh_user"


def test_without_a_bridge_yaml_the_module_s_relay_yaml_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "DEFAULT_PATH", tmp_path / "no-bridge.yaml")
    relay_yaml = module_yaml(tmp_path, "bolt")
    settings = load(environ={"RELAY_MODULE_CONFIG": str(relay_yaml)})
    assert (settings.source, settings.backend) == (relay_yaml, "bolt")
    bridge_yaml = write(tmp_path, f"relay_api_url: https://bridge.example\nrelay_connection_token: {TOKEN}\n")
    monkeypatch.setattr(config, "DEFAULT_PATH", bridge_yaml)
    assert load(environ={"RELAY_MODULE_CONFIG": str(relay_yaml)}).source == bridge_yaml  # ours comes first


def test_a_configuration_file_named_but_missing_is_an_error(tmp_path):
    with pytest.raises(ConfigError) as caught:
        load(tmp_path / "typo.yaml", environ={})
    assert caught.value.key == str(tmp_path / "typo.yaml")
    with pytest.raises(ConfigError):
        load(environ={"RELAY_CONFIG": str(tmp_path / "typo.yaml")})


def test_the_module_s_file_keys_are_not_read_from_the_environment(tmp_path):
    path = write(tmp_path, f"relay_api_url: https://a.example.com\nrelay_connection_token: {TOKEN}\n")
    assert load(path, environ={"RELAY_DEBUG": "yes", "RELAY_TEST": "whatever"}).debug is False


def test_environment_then_flags_override_the_file(tmp_path):
    path = write(
        tmp_path, f"relay_api_url: https://a.example.com\nrelay_connection_token: {TOKEN}\nbackend: ssh\n"
    )
    environ = {
        "RELAY_API_URL": "https://b.example.com",
        "RELAY_BACKEND": "bolt",
        "RELAY_VAR_DIR": "/not/ours",
    }
    config = load(path, environ=environ, overrides={"backend": "orchestrator", "state_dir": None})
    assert config.relay_api_url == "https://b.example.com/" and config.backend == "orchestrator"


def test_the_token_can_come_from_a_file(tmp_path):
    (tmp_path / "token").write_text(TOKEN + "\n")
    path = write(
        tmp_path, f"relay_api_url: https://a.example.com\nrelay_connection_token_file: {tmp_path}/token\n"
    )
    assert load(path, environ={}).relay_connection_token == TOKEN


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("relay_connection_token: {token}\n", "relay_api_url"),
        ("relay_api_url: ftp://x\nrelay_connection_token: {token}\n", "relay_api_url"),
        ("relay_api_url: https://x\n", "relay_connection_token"),
        ("relay_api_url: https://x\nrelay_connection_token: rlyt_trigger\n", "relay_connection_token"),
        ("relay_api_url: https://x\nrelay_connection_token_file: /nope\n", "relay_connection_token_file"),
        ("relay_api_url: https://x\nrelay_connection_token: {token}\nbackend: telnet\n", "backend"),
        (
            "relay_api_url: https://x\nrelay_connection_token: {token}\nbackend_telnet_user: x\n",
            "backend_telnet_user",
        ),
        (
            "relay_api_url: https://x\nrelay_connection_token: {token}\nproxy_host: p\nproxy_port: http\n",
            "proxy_port",
        ),
        ("relay_api_url: https://x\nrelay_connection_token: {token}\nproxy_port: 3128\n", "proxy_host"),
        ("relay_api_url: https://x\nrelay_connection_token: {token}\nrelay_api_ur: typo\n", "relay_api_ur"),
        ("relay_api_url: https://x\nrelay_connection_token: {token}\nbackend: dummy\n", "backend"),
        ("relay_api_url: https://x\nrelay_connection_token: {token}\nproxy_host: p\n", "proxy_port"),
        ("relay_api_url: https://x\nrelay_connection_token: {token}\ndebug: loud\n", "debug"),
        ("relay_trigger_token: rlyt_x\nrelay_connection_token: {token}\n", "relay_api_url"),
        (
            "relay_api_url: https://x\nrelay_connection_token: {token}\npuppetdb_url: pdb:8081\n",
            "puppetdb_url",
        ),
        ("relay_api_url: https://x\nrelay_connection_token: {token}\npuppetdb_url: [a]\n", "puppetdb_url"),
        (
            "relay_api_url: https://x\nrelay_connection_token: {token}\npuppetdb_cert: /c.pem\n",
            "puppetdb_cert",
        ),
        (
            "relay_api_url: https://x\nrelay_connection_token: {token}\n"
            "puppetdb_url: https://pdb:8081\npuppetdb_key: [k]\n",
            "puppetdb_key",
        ),
        (
            "relay_api_url: https://x\nrelay_connection_token: {token}\npuppetdb_report_wait: soon\n",
            "puppetdb_report_wait",
        ),
        (
            "relay_api_url: https://x\nrelay_connection_token: {token}\npuppetdb_report_wait: -1\n",
            "puppetdb_report_wait",
        ),
    ],
)
def test_invalid_configuration_names_the_key(tmp_path, text, key):
    with pytest.raises(ConfigError) as caught:
        load(write(tmp_path, text.format(token=TOKEN)), environ={})
    assert caught.value.key == key


def test_puppetdb_over_https_defaults_to_the_agent_s_certificate_key_and_ca(tmp_path):
    """As the module does for puppetserver: the agent's ssldir and certname, as Puppet says."""
    import subprocess

    from relay_bridge.backends.evidence import Evidence
    from relay_bridge.backends.query import QueryScoped
    from relay_bridge.puppetdb import connect

    def setting(name: str) -> str:
        argv = ["puppet", "config", "print", name, "--section", "agent"]
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()

    base = f"relay_api_url: https://x\nrelay_connection_token: {TOKEN}\nbackend: ssh\n"
    loaded = load(write(tmp_path, base + "puppetdb_url: https://puppetdb.example.com:8081\n"), environ={})
    client = connect(loaded)
    ssldir, certname = Path(setting("ssldir")), setting("certname")
    assert client.session.cert == (
        str(ssldir / f"certs/{certname}.pem"),
        str(ssldir / f"private_keys/{certname}.pem"),
    )
    assert client.session.verify == str(ssldir / "certs/ca.pem")
    # Query scopes, and the runs' reports from PuppetDB (not from the nodes) up to 30 s.
    backend = make(loaded)
    assert isinstance(backend, Evidence) and (backend.by, backend.limit) == ("job_id", 30)
    assert isinstance(backend.backend, QueryScoped) and backend.backend.backend.report_max_bytes == 0
    assert backend.puppetdb is backend.backend.puppetdb
    # puppetdb_report_wait 0: query scopes only; the nodes print their reports as before.
    waitless = load(
        write(tmp_path, base + "puppetdb_url: https://pdb:8081\npuppetdb_report_wait: 0\n"), environ={}
    )
    assert isinstance(make(waitless), QueryScoped) and make(waitless).backend.report_max_bytes > 0
    # Each may be named instead; over http, none is used.
    named = load(
        write(tmp_path, base + "puppetdb_url: https://pdb:8081\npuppetdb_cacert: /etc/pdb-ca.pem\n"),
        environ={},
    )
    assert connect(named).session.verify == "/etc/pdb-ca.pem"
    plain = connect(load(write(tmp_path, base + "puppetdb_url: http://localhost:8080\n"), environ={}))
    assert plain.session.cert is None
    # Without puppetdb_url, the backend is as before.
    assert isinstance(make(load(write(tmp_path, base), environ={})), SshBackend)
