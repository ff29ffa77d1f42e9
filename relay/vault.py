"""The one place that talks to Vault (or OpenBao) through hvac, KV version 2.

Secrets live at `<VAULT_MOUNT_POINT>/<VAULT_PATH_PREFIX>/<kind>/<id>`, for example
`secret/relay/connections/puppet/8e659097-254a-4b27-bb93-88efea9a9f0e` holding
`{"token": "rlyp_…"}`. Authentication is VAULT_TOKEN, or AppRole (VAULT_ROLE_ID and
VAULT_SECRET_ID); the client renews its token before it runs out, or logs in again.

Every secret carries this deployment's id (RELAY_DEPLOYMENT_ID) in its KV v2 custom metadata
(`relay_deployment`), so that deployments sharing one Vault and prefix (staging beside
production) can tell their secrets apart: the reconciler deletes only its own.

Every failure (unreachable, sealed, forbidden, check-and-set lost) is raised as
VaultUnavailable with a sentence a user can act on. Those sentences reach API users, so they
never say where Vault is: the log does.
"""

import logging
import threading
import time
from typing import Any

import hvac
import hvac.exceptions
import hvac.utils
import requests
from django.conf import settings

log = logging.getLogger(__name__)


class VaultUnavailable(Exception):
    """Vault could not do what was asked; the message says why, without secrets."""


_lock = threading.Lock()
_client: hvac.Client | None = None
_renew_at: float | None = None  # monotonic time to renew or log in again; None: never


def reset() -> None:
    """Forget the client, so the next call builds one from the current settings."""
    global _client, _renew_at
    with _lock:
        _client, _renew_at = None, None


def _build() -> tuple[hvac.Client, float | None]:
    client = hvac.Client(
        url=settings.VAULT_ADDR,
        verify=settings.VAULT_CACERT or True,
        timeout=settings.VAULT_TIMEOUT,
        namespace=settings.VAULT_NAMESPACE or None,
    )
    if settings.VAULT_ROLE_ID:
        auth = client.auth.approle.login(
            role_id=settings.VAULT_ROLE_ID,
            secret_id=settings.VAULT_SECRET_ID,
            mount_point=settings.VAULT_APPROLE_MOUNT,
        )["auth"]
        ttl, renewable = auth["lease_duration"], auth["renewable"]
    else:
        client.token = settings.VAULT_TOKEN
        data = client.auth.token.lookup_self()["data"]
        ttl, renewable = data["ttl"], data["renewable"]
    return client, _renewal_deadline(ttl, renewable)


def _renewal_deadline(ttl: int, renewable: bool) -> float | None:
    if not ttl:
        return None  # a root or non-expiring token
    # Renew (or log in again) at two thirds of the lifetime, well before it runs out.
    return time.monotonic() + ttl * 2 / 3 if renewable or settings.VAULT_ROLE_ID else None


def _client_now() -> hvac.Client:
    global _client, _renew_at
    with _lock:
        if _client is not None and _renew_at is not None and time.monotonic() >= _renew_at:
            try:
                data = _client.auth.token.renew_self()["auth"]
                _renew_at = _renewal_deadline(data["lease_duration"], data["renewable"])
            except (hvac.exceptions.VaultError, requests.RequestException):
                log.info("vault token renewal failed; logging in again")
                _client = None
        if _client is None:
            _client, _renew_at = _build()
        return _client


def _call(action: str, func: Any) -> Any:
    """Run func(client), turning every failure into VaultUnavailable."""
    try:
        return func(_client_now())
    except hvac.exceptions.VaultDown as exc:
        raise VaultUnavailable(f"Vault is sealed or down; could not {action}.") from exc
    except hvac.exceptions.Forbidden as exc:
        reset()
        raise VaultUnavailable(f"Vault refused permission to {action}.") from exc
    except hvac.exceptions.InvalidRequest as exc:
        if "check-and-set" in str(exc):
            raise VaultUnavailable(
                f"Vault's check-and-set failed; another writer changed the secret; could not {action}."
            ) from exc
        raise VaultUnavailable(f"Vault rejected the request to {action}.") from exc
    except hvac.exceptions.VaultError as exc:
        raise VaultUnavailable(f"Vault answered with an error; could not {action}.") from exc
    except requests.RequestException as exc:
        reset()
        log.warning("vault at %s is unreachable: %s", settings.VAULT_ADDR, exc)
        raise VaultUnavailable(f"Vault is unreachable; could not {action}.") from exc


def path_for(kind: str, object_id: object) -> str:
    return f"{settings.VAULT_PATH_PREFIX}/{kind}/{object_id}"


DEPLOYMENT_KEY = "relay_deployment"


def write(path: str, data: dict[str, str], cas: int) -> int:
    """Write a new version only if the newest is `cas` (0: only if none exists). Returns it.

    The secret is tagged with this deployment's id. A new one is tagged after its first
    version, because it is check-and-set that keeps someone else's secret at the same path
    safe (if the tag then fails, the new secret is deleted again); an existing one is ours
    (our row points at it), and is tagged first, so a secret from before the tags gets one."""

    def put(client: hvac.Client) -> int:
        if cas:
            _tag(client, path)
        result = client.secrets.kv.v2.create_or_update_secret(
            path=path, secret=data, cas=cas, mount_point=settings.VAULT_MOUNT_POINT
        )
        if not cas:
            try:
                _tag(client, path)
            except Exception:
                _delete_quietly(client, path)
                raise
        return int(result["data"]["version"])

    return _call("store a secret", put)


def _tag(client: hvac.Client, path: str) -> None:
    if not settings.RELAY_DEPLOYMENT_ID:
        return  # nothing to tell apart; the reconciler deletes nothing (relay.tasks)
    # A POST of custom_metadata alone (hvac's update_metadata also resets delete_version_after).
    client.adapter.post(
        hvac.utils.format_url("/v1/{mount}/metadata/{path}", mount=settings.VAULT_MOUNT_POINT, path=path),
        json={"custom_metadata": {DEPLOYMENT_KEY: settings.RELAY_DEPLOYMENT_ID}},
    )


def _delete_quietly(client: hvac.Client, path: str) -> None:
    try:
        client.secrets.kv.v2.delete_metadata_and_all_versions(
            path=path, mount_point=settings.VAULT_MOUNT_POINT
        )
    except (hvac.exceptions.VaultError, requests.RequestException) as exc:
        log.warning("vault secret %s was written but not tagged, nor deleted: %s", path, exc)


def deployment_of(metadata: dict[str, Any]) -> str | None:
    """The deployment a secret's metadata (from metadata()) names; None when untagged."""
    return (metadata.get("custom_metadata") or {}).get(DEPLOYMENT_KEY)


def read_with_version(path: str) -> tuple[dict[str, str], int]:
    """The newest data and its version; ({}, 0) when there is no secret (0 is also the
    check-and-set value that means 'create only')."""

    def get(client: hvac.Client) -> tuple[dict[str, str], int]:
        try:
            result = client.secrets.kv.v2.read_secret_version(
                path=path, mount_point=settings.VAULT_MOUNT_POINT, raise_on_deleted_version=False
            )
        except hvac.exceptions.InvalidPath:
            return {}, 0
        return result["data"]["data"] or {}, int(result["data"]["metadata"]["version"])

    return _call("read a secret", get)


def read(path: str, version: int | None = None) -> dict[str, str] | None:
    def get(client: hvac.Client) -> dict[str, str] | None:
        try:
            result = client.secrets.kv.v2.read_secret_version(
                path=path,
                version=version,
                mount_point=settings.VAULT_MOUNT_POINT,
                raise_on_deleted_version=True,
            )
        except hvac.exceptions.InvalidPath:
            return None
        return result["data"]["data"]

    return _call("read a secret", get)


def delete(path: str) -> None:
    """Delete every version and the metadata; deleting what is not there is no error."""
    _call(
        "delete a secret",
        lambda client: client.secrets.kv.v2.delete_metadata_and_all_versions(
            path=path, mount_point=settings.VAULT_MOUNT_POINT
        ),
    )


def list_keys(folder: str) -> list[str]:
    def ls(client: hvac.Client) -> list[str]:
        try:
            result = client.secrets.kv.v2.list_secrets(path=folder, mount_point=settings.VAULT_MOUNT_POINT)
        except hvac.exceptions.InvalidPath:
            return []
        return list(result["data"]["keys"])

    return _call("list secrets", ls)


def metadata(path: str) -> dict[str, Any] | None:
    def get(client: hvac.Client) -> dict[str, Any] | None:
        try:
            return client.secrets.kv.v2.read_secret_metadata(
                path=path, mount_point=settings.VAULT_MOUNT_POINT
            )["data"]
        except hvac.exceptions.InvalidPath:
            return None

    return _call("read a secret's metadata", get)
