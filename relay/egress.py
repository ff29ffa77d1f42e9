"""HTTPS to URLs that users choose (Slack webhooks), which may reach public addresses only.

The check is made when connecting, on the very address connected to: the name is resolved
once, every address it gives is checked, and the socket is opened to a checked address
(TLS still verifies the certificate against the name, and SNI and Host carry the name). A
name that pointed elsewhere when the URL was saved, or that changes its answer between two
lookups (DNS rebinding), cannot lead a request to loopback, a private network or a cloud
metadata address."""

import ipaddress
import socket
from typing import ClassVar

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPSConnection
from urllib3.connectionpool import HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError
from urllib3.util import connection

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # IPv4 addresses spelt as IPv6 by NAT64 gateways


class ForbiddenAddress(Exception):
    """The destination resolves to an address outside the public internet. (Not an OSError,
    so that urllib3 and requests let it through as it is instead of retrying it.)"""


def why_forbidden(address: IPAddress, allow_loopback: bool = False) -> str | None:
    """None for a public unicast address; otherwise what kind of address it is. IPv6
    addresses that carry an IPv4 address (mapped, 6to4, Teredo, NAT64) are judged by it too."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:  # ::ffff:127.0.0.1 is 127.0.0.1
            return why_forbidden(address.ipv4_mapped, allow_loopback)
        embedded = [address.sixtofour, address.teredo[1] if address.teredo else None]
        if address in NAT64:
            embedded.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
        for inner in filter(None, embedded):
            reason = why_forbidden(inner, allow_loopback)
            if reason:
                return f"{reason} (inside {address})"
    if address.is_loopback:
        return None if allow_loopback else "a loopback address"
    for kind, flag in (
        ("an unspecified address", address.is_unspecified),
        ("a link-local address", address.is_link_local),  # 169.254.169.254: cloud metadata
        ("a multicast address", address.is_multicast),
        ("a reserved address", address.is_reserved),
        ("a private address", address.is_private),
        ("not a public address", not address.is_global),  # e.g. 100.64.0.0/10, carrier NAT
    ):
        if flag:
            return kind
    return None


def public_addresses(host: str, port: int, allow_loopback: bool = False) -> list[str]:
    """Every address `host` resolves to, once, if all of them are public; ForbiddenAddress
    if any is not (a name that mixes public and private addresses is refused as a whole)."""
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
    for text in addresses:
        reason = why_forbidden(ipaddress.ip_address(text.split("%", 1)[0]), allow_loopback)
        if reason:
            raise ForbiddenAddress(f"{host} resolves to {text}, {reason}")
    return addresses


class PublicHTTPSConnection(HTTPSConnection):
    allow_loopback: ClassVar[bool] = False

    def _new_conn(self) -> socket.socket:
        # urllib3's own _new_conn resolves the name and connects; this one connects to the
        # addresses it has checked, and maps errors the same way.
        try:
            addresses = public_addresses(self._dns_host, self.port, self.allow_loopback)
        except socket.gaierror as exc:
            raise NameResolutionError(self.host, self, exc) from exc
        error: OSError | None = None
        for address in addresses:
            try:
                return connection.create_connection(
                    (address, self.port),
                    self.timeout,
                    source_address=self.source_address,
                    socket_options=self.socket_options,
                )
            except TimeoutError as exc:
                error = ConnectTimeoutError(self, f"Connection to {self.host} ({address}) timed out.")
                error.__cause__ = exc
            except OSError as exc:
                error = NewConnectionError(self, f"Failed to connect to {self.host} ({address}): {exc}")
        assert error is not None  # getaddrinfo gives at least one address or raises
        raise error


class LoopbackHTTPSConnection(PublicHTTPSConnection):
    allow_loopback = True


class PublicHTTPSConnectionPool(HTTPSConnectionPool):
    ConnectionCls = PublicHTTPSConnection


class LoopbackHTTPSConnectionPool(HTTPSConnectionPool):
    ConnectionCls = LoopbackHTTPSConnection


class PublicHTTPSAdapter(HTTPAdapter):
    def __init__(self, allow_loopback: bool = False) -> None:
        self.pool_class = LoopbackHTTPSConnectionPool if allow_loopback else PublicHTTPSConnectionPool
        super().__init__(max_retries=0)

    def init_poolmanager(self, *args: object, **kwargs: object) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"https": self.pool_class}


class PublicSession(requests.Session):
    def get_redirect_target(self, resp: requests.Response) -> None:
        # A redirect is an answer, never followed: its target was not the URL the user gave.
        return None


def session(allow_loopback: bool = False, verify: str | bool = True) -> requests.Session:
    """A session that speaks HTTPS only, to public addresses only, and never follows a
    redirect. It ignores proxy variables, so that the address checked is the one connected
    to. `allow_loopback` is for tests, whose stand-ins listen on loopback."""
    http = PublicSession()
    http.trust_env = False  # no HTTPS_PROXY, no .netrc, no REQUESTS_CA_BUNDLE
    http.verify = verify
    http.adapters.clear()  # http:// has no adapter: requests refuses it (InvalidSchema)
    http.mount("https://", PublicHTTPSAdapter(allow_loopback))
    return http
