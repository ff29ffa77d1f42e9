from pathlib import Path

import pytest
from relay_bridge.config import ConfigError, load

TOKEN = "rlyp_" + "a" * 61


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
    ],
)
def test_invalid_configuration_names_the_key(tmp_path, text, key):
    with pytest.raises(ConfigError) as caught:
        load(write(tmp_path, text.format(token=TOKEN)), environ={})
    assert caught.value.key == key
