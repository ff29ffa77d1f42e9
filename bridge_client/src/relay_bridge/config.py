"""The bridge's configuration: a YAML file whose keys are the Puppet module's `relay.yaml`
keys, then environment variables (`RELAY_<KEY>` upper-cased), then command-line values.
Anything invalid raises ConfigError naming the key; the commands exit 2 with it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

DEFAULT_PATH = Path("/etc/relay/bridge.yaml")
BACKENDS = ("orchestrator", "bolt", "ssh")
KNOWN = (
    "relay_api_url",
    "relay_connection_token",
    "relay_connection_token_file",
    "backend",
    "proxy_host",
    "proxy_port",
    "proxy_user",
    "proxy_password",
    "state_dir",
    "heartbeat_interval",  # ours, not the module's: seconds between heartbeats (default 15)
)


class ConfigError(Exception):
    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key


@dataclass(frozen=True)
class Config:
    relay_api_url: str
    relay_connection_token: str = field(repr=False)  # never in a repr, a log or a traceback
    backend: str | None  # None: choose as the RFC says (bolt if on PATH, else ssh)
    backend_options: dict[str, dict[str, Any]]
    proxy_url: str | None = field(repr=False)  # may hold the proxy password
    state_dir: Path
    heartbeat_interval: float = 15.0

    def options(self, backend: str) -> dict[str, Any]:
        return self.backend_options.get(backend, {})


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """RELAY_API_URL, RELAY_CONNECTION_TOKEN(_FILE), RELAY_BACKEND, RELAY_STATE_DIR,
    RELAY_PROXY_*, RELAY_BACKEND_<BACKEND>_<OPTION>; other RELAY_* variables are not ours."""
    values: dict[str, Any] = {}
    for name, value in environ.items():
        key = name.removeprefix("RELAY_").lower()
        if key in ("api_url", "connection_token", "connection_token_file"):
            key = f"relay_{key}"
        if name.startswith("RELAY_") and (key in KNOWN or key.startswith("backend_")):
            values[key] = value
    return values


def load(
    path: Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    environ = os.environ if environ is None else environ
    path = path or Path(environ.get("RELAY_CONFIG", str(DEFAULT_PATH)))
    values: dict[str, Any] = {}
    if path.exists():
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(str(path), f"cannot be read: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(str(path), "must be a mapping of keys to values")
        values.update(loaded)
    values.update(_from_env(environ))
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return _validate(values)


def _validate(values: dict[str, Any]) -> Config:
    for key in values:
        if key not in KNOWN and not key.startswith("backend_"):
            raise ConfigError(key, "is not a configuration key")

    url = values.get("relay_api_url")
    if not isinstance(url, str) or urlparse(url).scheme not in ("http", "https") or not urlparse(url).netloc:
        raise ConfigError("relay_api_url", "must be an http(s) URL, e.g. https://api.relay.sh/")

    token = values.get("relay_connection_token")
    token_file = values.get("relay_connection_token_file")
    if token and token_file:
        raise ConfigError("relay_connection_token", "give it or relay_connection_token_file, not both")
    if token_file:
        try:
            token = Path(str(token_file)).read_text().strip()
        except OSError as exc:
            raise ConfigError("relay_connection_token_file", f"cannot be read: {exc.strerror}") from None
    if not isinstance(token, str) or not token.startswith("rlyp_"):
        raise ConfigError("relay_connection_token", "must be the connection's token (rlyp_...)")

    backend = values.get("backend")
    if backend is not None and backend not in BACKENDS:
        raise ConfigError("backend", f"must be one of {', '.join(BACKENDS)}")

    options: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        if key.startswith("backend_"):
            name, _, option = key[len("backend_") :].partition("_")
            if name not in BACKENDS or not option:
                raise ConfigError(key, f"must be backend_<{'|'.join(BACKENDS)}>_<option>")
            options.setdefault(name, {})[option] = value

    proxy_url = None
    if values.get("proxy_host"):
        port = values.get("proxy_port", 3128)
        try:
            port = int(port)
        except (TypeError, ValueError):
            raise ConfigError("proxy_port", "must be a port number") from None
        if not 0 < port < 65536:
            raise ConfigError("proxy_port", "must be a port number")
        user, password = values.get("proxy_user"), values.get("proxy_password")
        credentials = f"{user}:{password}@" if user else ""
        proxy_url = f"http://{credentials}{values['proxy_host']}:{port}"
    elif values.get("proxy_port") or values.get("proxy_user"):
        raise ConfigError("proxy_host", "is needed with proxy_port or proxy_user")

    try:
        heartbeat = float(values.get("heartbeat_interval", 15.0))
    except (TypeError, ValueError):
        raise ConfigError("heartbeat_interval", "must be a number of seconds") from None
    if not 0 < heartbeat <= 3600:
        raise ConfigError("heartbeat_interval", "must be more than 0 and at most 3600 seconds")

    return Config(
        relay_api_url=url.rstrip("/") + "/",
        relay_connection_token=token,
        backend=backend,
        backend_options=options,
        proxy_url=proxy_url,
        state_dir=Path(str(values.get("state_dir", "/var/lib/relay-bridge"))).absolute(),
        heartbeat_interval=heartbeat,
    )
