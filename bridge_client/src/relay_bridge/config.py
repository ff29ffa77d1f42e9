"""The bridge's configuration: a YAML file whose keys are the Puppet module's `relay.yaml`
keys, then environment variables (`RELAY_<KEY>` upper-cased), then command-line values.
Anything invalid raises ConfigError naming the key; the commands exit 2 with it.

The file is `--config`, else $RELAY_CONFIG, else /etc/relay/bridge.yaml, else the module's
own /etc/puppetlabs/puppet/relay.yaml (puppetlabs-relay 2.5.1 writes it): a host that the
module configured needs no configuration of its own. Every key that module knows means
what it means there (`lib/puppet_x/relay/util/settings.rb`), so no relay.yaml it renders is
refused for a key."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

import yaml

from relay_bridge.inventory import DEFAULT_FACTS

DEFAULT_PATH = Path("/etc/relay/bridge.yaml")
# The module's relay.yaml (`${settings::confdir}/relay.yaml`). $RELAY_MODULE_CONFIG moves it
# (for tests, or a Puppet with another confdir).
MODULE_PATH = Path("/etc/puppetlabs/puppet/relay.yaml")
BACKENDS = ("orchestrator", "bolt", "ssh")
KNOWN = (
    "relay_api_url",
    "relay_connection_token",
    "relay_connection_token_file",  # ours: the token in a file of its own
    "relay_trigger_token",  # the module's report processor's; not the bridge's business
    "debug",
    "test",
    "backend",
    "proxy_host",
    "proxy_port",
    "proxy_user",
    "proxy_password",
    "state_dir",
    "heartbeat_interval",  # ours, not the module's: seconds between heartbeats (default 15)
    # Ours: PuppetDB, for `query` scopes on Bolt and SSH (relay_bridge.puppetdb). https with
    # the agent's certificate, key and CA unless these name others; http for its localhost port.
    "puppetdb_url",
    "puppetdb_cert",
    "puppetdb_key",
    "puppetdb_cacert",
    # Ours: how long to wait for a run's reports to appear in PuppetDB (seconds; 0: the
    # reports are not read from PuppetDB). relay_bridge.backends.evidence.
    "puppetdb_report_wait",
    # Ours: the node inventory sent from PuppetDB (relay_bridge.inventory): the facts that may
    # leave the site (dotted paths; default relay_bridge.inventory.DEFAULT_FACTS), and the
    # seconds between syncs in `serve` (0: only when the service asks, and in `poll --once`).
    "inventory_facts",
    "inventory_interval",
)
# Keys read from the file only: RELAY_DEBUG or RELAY_TEST in a shell's environment are
# somebody else's, and a trigger token has no business in the bridge's environment.
FILE_ONLY = ("relay_trigger_token", "debug", "test")
FACT_PATH_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*(\.[A-Za-z0-9_][A-Za-z0-9_-]*)*")
TRUE, FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")


class ConfigError(Exception):
    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key


@dataclass(frozen=True)
class Config:
    relay_api_url: str
    relay_connection_token: str = field(repr=False)  # never in a repr, a log or a traceback
    backend: str | None  # None: choose as the RFC says (bolt if on PATH, else ssh)
    backend_options: dict[str, dict[str, Any]] = field(repr=False)  # RBAC token, Bolt's password
    proxy_url: str | None = field(repr=False)  # may hold the proxy password
    state_dir: Path
    heartbeat_interval: float = 15.0
    debug: bool = False  # the module's `debug`: log at debug level
    puppetdb_url: str | None = None
    puppetdb_tls: tuple[str | None, str | None, str | None] = (None, None, None)  # cert, key, CA
    puppetdb_report_wait: float = 30.0
    inventory_facts: tuple[str, ...] = ()  # with puppetdb_url: what leaves the site
    inventory_interval: float = 300.0
    source: Path | None = None  # the file read, if any

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
        if (
            name.startswith("RELAY_")
            and key not in FILE_ONLY
            and (key in KNOWN or key.startswith("backend_"))
        ):
            values[key] = value
    return values


def find(path: Path | None, environ: Mapping[str, str]) -> Path | None:
    """The file to read: one named (--config, RELAY_CONFIG) must exist; else the first of
    bridge.yaml and the module's relay.yaml that does, or none (environment and flags)."""
    named = path or (Path(environ["RELAY_CONFIG"]) if environ.get("RELAY_CONFIG") else None)
    if named:
        if not named.exists():
            raise ConfigError(str(named), "does not exist")
        return named
    for candidate in (DEFAULT_PATH, Path(environ.get("RELAY_MODULE_CONFIG") or MODULE_PATH)):
        if candidate.exists():
            return candidate
    return None


def load(
    path: Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    environ = os.environ if environ is None else environ
    path = find(path, environ)
    values: dict[str, Any] = {}
    if path:
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(str(path), f"cannot be read: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(str(path), "must be a mapping of keys to values")
        values.update(loaded)
    values.update(_from_env(environ))
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return _validate(values, path)


def boolean(values: Mapping[str, Any], key: str) -> bool:
    value = values.get(key)
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, str) and value.lower() in TRUE + FALSE:
        return value.lower() in TRUE
    raise ConfigError(key, "must be true or false")


def _validate(values: dict[str, Any], source: Path | None = None) -> Config:
    for key in values:
        if key not in KNOWN and not key.startswith("backend_"):
            raise ConfigError(key, "is not a configuration key")
    debug = boolean(values, "debug")
    # The module's `test` is its agent's one-round foreground mode (`puppet relay --test`),
    # which the file key does not switch on there either; relay-bridge's is `poll --once`.
    boolean(values, "test")

    url = values.get("relay_api_url")
    if url is None:
        raise ConfigError(
            "relay_api_url",
            "is not set: the URL of this Relay service (the module's default, "
            "https://api.relay.sh, is not it)",
        )
    if not isinstance(url, str) or urlparse(url).scheme not in ("http", "https") or not urlparse(url).netloc:
        raise ConfigError("relay_api_url", "must be an http(s) URL, e.g. https://relay.example.com/")

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
    if backend == "dummy":
        raise ConfigError(
            "backend",
            "dummy is the module's test backend, which runs no Puppet and reports "
            f"success; relay-bridge has no such thing: use one of {', '.join(BACKENDS)}",
        )
    if backend is not None and backend not in BACKENDS:
        raise ConfigError("backend", f"must be one of {', '.join(BACKENDS)}")

    options: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        if key.startswith("backend_"):
            name, _, option = key[len("backend_") :].partition("_")
            if name not in BACKENDS or not option:
                raise ConfigError(key, f"must be backend_<{'|'.join(BACKENDS)}>_<option>")
            options.setdefault(name, {})[option] = value

    proxy_url = _proxy_url(values)

    try:
        heartbeat = float(values.get("heartbeat_interval", 15.0))
    except (TypeError, ValueError):
        raise ConfigError("heartbeat_interval", "must be a number of seconds") from None
    if not 0 < heartbeat <= 3600:
        raise ConfigError("heartbeat_interval", "must be more than 0 and at most 3600 seconds")

    puppetdb_url = values.get("puppetdb_url") or None
    if puppetdb_url is not None and (
        not isinstance(puppetdb_url, str)
        or urlparse(puppetdb_url).scheme not in ("http", "https")
        or not urlparse(puppetdb_url).netloc
    ):
        raise ConfigError("puppetdb_url", "must be an http(s) URL, e.g. https://puppetdb.example.com:8081")
    if puppetdb_url is not None and "@" in urlparse(puppetdb_url).netloc:
        # PuppetDB lets clients in by certificate; a password in the URL would be in every
        # error naming PuppetDB, in the log and on the service's pages (a failed sync's error).
        raise ConfigError("puppetdb_url", "must not hold a user or password: PuppetDB takes a certificate")
    for key in ("puppetdb_cert", "puppetdb_key", "puppetdb_cacert"):
        value = values.get(key) or None
        if value is not None and not isinstance(value, str):
            raise ConfigError(key, "must be a file's path")
        if value is not None and puppetdb_url is None:
            raise ConfigError(key, "is for puppetdb_url, which is not set")
    tls = tuple(values.get(key) or None for key in ("puppetdb_cert", "puppetdb_key", "puppetdb_cacert"))
    try:
        report_wait = float(values.get("puppetdb_report_wait", 30.0))
    except (TypeError, ValueError):
        raise ConfigError("puppetdb_report_wait", "must be a number of seconds") from None
    if not 0 <= report_wait <= 3600:
        raise ConfigError("puppetdb_report_wait", "must be from 0 to 3600 seconds")
    facts = _inventory_facts(values.get("inventory_facts"), puppetdb_url)
    try:
        interval = float(values.get("inventory_interval", 300.0))
    except (TypeError, ValueError):
        raise ConfigError("inventory_interval", "must be a number of seconds") from None
    if not (interval == 0 or 10 <= interval <= 86400):
        raise ConfigError("inventory_interval", "must be 0 (off) or from 10 to 86400 seconds")

    return Config(
        relay_api_url=url.rstrip("/") + "/",
        relay_connection_token=token,
        backend=backend,
        backend_options=options,
        proxy_url=proxy_url,
        state_dir=Path(str(values.get("state_dir", "/var/lib/relay-bridge"))).absolute(),
        heartbeat_interval=heartbeat,
        debug=debug,
        source=source,
        puppetdb_url=puppetdb_url,
        puppetdb_tls=tls,  # type: ignore[arg-type]
        puppetdb_report_wait=report_wait,
        inventory_facts=facts,
        inventory_interval=interval,
    )


def _inventory_facts(value: Any, puppetdb_url: str | None) -> tuple[str, ...]:
    """The allow-list: a YAML list, or comma-separated text (an environment variable)."""
    if value is None:
        return DEFAULT_FACTS if puppetdb_url else ()
    if puppetdb_url is None:
        raise ConfigError("inventory_facts", "is for puppetdb_url, which is not set")
    paths = [p.strip() for p in value.split(",")] if isinstance(value, str) else value
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise ConfigError("inventory_facts", "must be a list of dotted fact paths, e.g. [os.family, kernel]")
    paths = [p for p in paths if p]
    for path in paths:
        if not FACT_PATH_RE.fullmatch(path):
            raise ConfigError(
                "inventory_facts", f"{path[:100]!r} is not a dotted fact path (os.release.full)"
            )
    return tuple(dict.fromkeys(paths))


def _proxy_url(values: Mapping[str, Any]) -> str | None:
    """The module's proxy: an HTTP proxy at proxy_host:proxy_port (the port is required, as
    the module requires it), with Basic credentials when proxy_user is given. It carries
    every call to Relay, http or https (CONNECT)."""
    host, port = values.get("proxy_host"), values.get("proxy_port")
    user, password = values.get("proxy_user"), values.get("proxy_password")
    if not host:
        if port or user or password:
            raise ConfigError("proxy_host", "is needed with proxy_port, proxy_user or proxy_password")
        return None
    if not isinstance(host, str) or any(c in host for c in "/@?# "):
        raise ConfigError("proxy_host", "must be a host name or address")
    if port is None:
        raise ConfigError("proxy_port", "is needed with proxy_host")
    try:
        number = int(port)
    except (TypeError, ValueError):
        raise ConfigError("proxy_port", "must be a port number") from None
    if isinstance(port, bool) or not 0 < number < 65536:
        raise ConfigError("proxy_port", "must be a port number")
    if password and not user:
        raise ConfigError("proxy_user", "is needed with proxy_password")
    # Quoted: a password with `@`, `:` or `/` in it must not end the URL's user part.
    credentials = f"{quote(str(user), safe='')}:{quote(str(password or ''), safe='')}@" if user else ""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address
    return f"http://{credentials}{host}:{number}"
