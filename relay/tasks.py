import logging
import uuid
from datetime import datetime, timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from relay import vault
from relay.vaulted import vault_backed_models

log = logging.getLogger(__name__)

# A secret younger than this may belong to a create whose transaction has not committed yet.
ORPHAN_GRACE = timedelta(minutes=10)


@shared_task(acks_late=True)
def reconcile_vault_secrets() -> int:
    """Delete Vault secrets whose connection or trigger no longer exists. Runs from beat.

    This cleans up after a delete made while Vault was down, or a create whose commit failed
    after its Vault write. Only this deployment's secrets (tagged RELAY_DEPLOYMENT_ID) are
    deleted: another deployment sharing the Vault and prefix has rows this database lacks.
    A Vault error ends the run quietly: the next run tries again."""
    try:
        return delete_orphan_secrets(timezone.now())
    except vault.VaultUnavailable as exc:
        log.warning("vault reconcile skipped: %s", exc)
        return 0


def _is_uuid(key: str) -> bool:
    try:
        return str(uuid.UUID(key)) == key
    except ValueError:
        return False


def delete_orphan_secrets(now: datetime) -> int:
    """Returns how many secrets were deleted. Keys that are not ids of ours, and secrets
    another deployment tagged, are left alone; untagged ones too, with a warning."""
    deployment = settings.RELAY_DEPLOYMENT_ID
    if not deployment:
        log.warning(
            "RELAY_DEPLOYMENT_ID is not set: the vault reconciler deletes nothing, since it cannot "
            "tell this deployment's secrets from another's"
        )
        return 0
    deleted = 0
    for model in vault_backed_models():
        folder = vault.path_for(model.VAULT_KIND, "")
        ids = {key for key in vault.list_keys(folder) if _is_uuid(key)}
        known = {str(pk) for pk in model._default_manager.filter(pk__in=ids).values_list("pk", flat=True)}
        for key in sorted(ids - known):
            path = folder + key
            meta = vault.metadata(path)
            created = parse_datetime(meta["created_time"]) if meta else None
            if meta is None or created is None or now - created < ORPHAN_GRACE:
                continue
            owner = vault.deployment_of(meta)
            if owner is None:
                log.warning(
                    "vault secret %s left alone: it has no deployment tag (written before tags, or "
                    "by something else); delete it by hand if nothing uses it",
                    path,
                )
                continue
            if owner != deployment:
                continue  # another deployment's, which has its row
            vault.delete(path)
            deleted += 1
            log.info("vault secret %s deleted: its %s is gone", path, model._meta.verbose_name)
    return deleted
