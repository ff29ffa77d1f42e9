"""PuppetDB's HTTP query API (https://www.puppet.com/docs/puppetdb/7/api/query/v4/overview),
on `requests`: over https with the Puppet agent's certificate, key and CA (PuppetDB lets in
the certificates its allow-list names), or http on PuppetDB's cleartext port, which listens
on localhost. A small module of our own rather than pypuppetdb: the bridge needs one POST
(a query, PQL or AST, as PE's orchestrator takes either) and PuppetDB's own error message
when the query is refused, which pypuppetdb turns into an exception without it.

The client only: relay_bridge.backends.query gives the Bolt and SSH backends the `query`
scope with it, relay_bridge.backends.evidence every backend the runs' reports."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import requests

# Where the Puppet agent keeps its certificate, key and CA (`puppet config print ssldir`),
# as the module reads them for puppetserver.
AGENT_SSLDIR = Path("/etc/puppetlabs/puppet/ssl")
MESSAGE_CHARS = 2000  # of PuppetDB's answer, in an error
# An answer read at most: a query names what it returns (`inventory {}` is every node's every
# fact), so past this the query is refused rather than read whole into memory.
MAX_ANSWER_BYTES = 64 * 1024 * 1024
CHUNK = 64 * 1024


class PuppetDBError(Exception):
    pass


@dataclass
class PuppetDB:
    url: str  # https://puppetdb:8081 or http://localhost:8080
    cert: str | None = None
    key: str | None = field(default=None, repr=False)
    cacert: str | None = None
    timeout: float = 30.0
    max_bytes: int = MAX_ANSWER_BYTES

    def __post_init__(self) -> None:
        self.clock: datetime | None = None
        self.session = requests.Session()
        self.session.trust_env = False  # PuppetDB is on this side of any proxy
        if urlparse(self.url).scheme == "https":
            if self.cert and self.key:
                self.session.cert = (self.cert, self.key)
            self.session.verify = self.cacert or True

    def query(
        self,
        query: str | list[Any],
        endpoint: str = "",
        timeout: float | None = None,
        **paging: Any,
    ) -> list[dict[str, Any]]:
        """Rows for `query`: PQL text (on /pdb/query/v4), or an AST (a list) on `endpoint`
        (`nodes`, `inventory`, …; the root when it starts with `from`); `paging` is PuppetDB's
        own (`order_by`, `limit`, `offset`). PuppetDBError with PuppetDB's own message when it
        refuses the query, or cannot be reached. `self.clock` is then PuppetDB's time of the
        answer (its Date header), for asking later what changed since."""
        path = "/pdb/query/v4" + (f"/{endpoint}" if endpoint else "")
        try:
            with self.session.post(
                self.url.rstrip("/") + path,
                json={"query": query, **paging},
                timeout=timeout or self.timeout,
                stream=True,
            ) as answer:
                refused = answer.status_code != 200
                body = self._body(answer, MESSAGE_CHARS * 4 if refused else self.max_bytes)
        except requests.RequestException as exc:
            raise PuppetDBError(f"PuppetDB at {self.url} could not be reached: {exc}") from None
        if refused:
            text = body.decode(errors="replace").strip()[:MESSAGE_CHARS] or answer.reason
            raise PuppetDBError(f"PuppetDB refused the query ({answer.status_code}): {text}")
        try:
            self.clock = parsedate_to_datetime(answer.headers["Date"])
        except (KeyError, TypeError, ValueError):
            self.clock = None
        try:
            rows = json.loads(body)
        except ValueError:
            raise PuppetDBError("PuppetDB's answer is not JSON") from None
        if not isinstance(rows, list):
            raise PuppetDBError("PuppetDB's answer is not a list of rows")
        return rows

    def _body(self, answer: requests.Response, limit: int) -> bytes:
        """The answer's body, up to `limit` bytes: an error's is cut there, rows past it refused."""
        chunks, size = [], 0
        for chunk in answer.iter_content(CHUNK):
            size += len(chunk)
            if size > limit:
                if answer.status_code != 200:
                    chunks.append(chunk[: len(chunk) - (size - limit)])
                    break
                raise PuppetDBError(
                    f"PuppetDB's answer is over {limit} bytes: ask for fewer nodes or fields"
                    " (project them, e.g. inventory[certname] { ... })"
                )
            chunks.append(chunk)
        return b"".join(chunks)

    def certnames(self, query: Any) -> list[str]:
        """The certnames a run's `query` scope names: PQL text, or an AST (a `from` query, or
        a node query such as `["=", ["fact", "kernel"], "Linux"]`), as PE's orchestrator
        takes them. Active nodes only (PuppetDB's default). Once each, in PuppetDB's order."""
        if isinstance(query, str):
            rows = self.query(query)
        elif isinstance(query, list) and query:
            rows = self.query(query, "" if query[0] == "from" else "nodes")
        else:
            raise PuppetDBError("The query must be PQL text or a PuppetDB AST query (a list).")
        names = []
        for row in rows:
            if not isinstance(row, dict) or not isinstance(row.get("certname"), str):
                raise PuppetDBError(
                    "The query's results have no certname: project it, e.g. inventory[certname] { ... }."
                )
            names.append(row["certname"])
        return list(dict.fromkeys(names))

    def close(self) -> None:
        self.session.close()


def agent_ssl_files(ssldir: Path | None = None) -> tuple[str, str, str]:
    """(cert, key, CA) of this host's Puppet agent: `ssldir` (else `puppet config print
    ssldir`, else the AIO default) and `certname` as the agent has them."""
    ssldir = ssldir or _puppet_setting("ssldir") or AGENT_SSLDIR
    certname = _puppet_setting("certname")
    if not certname:
        raise ValueError("the agent's certname could not be read (puppet config print certname)")
    return (
        str(Path(ssldir) / "certs" / f"{certname}.pem"),
        str(Path(ssldir) / "private_keys" / f"{certname}.pem"),
        str(Path(ssldir) / "certs" / "ca.pem"),
    )


def _puppet_setting(name: str) -> str | None:
    for puppet in ("/opt/puppetlabs/bin/puppet", "puppet"):
        try:
            done = subprocess.run(
                [puppet, "config", "print", name, "--section", "agent"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
    return None


def connect(config: Any) -> PuppetDB:
    """The PuppetDB the configuration names; over https, the agent's own certificate, key
    and CA for any of the three not set."""
    cert, key, cacert = config.puppetdb_tls
    if urlparse(config.puppetdb_url).scheme == "https" and not (cert and key and cacert):
        try:
            agent = agent_ssl_files()
        except ValueError:
            agent = (None, None, None)
        cert, key, cacert = cert or agent[0], key or agent[1], cacert or agent[2]
    return PuppetDB(config.puppetdb_url, cert, key, cacert)
