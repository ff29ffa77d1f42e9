"""Rows whose secret lives in Vault, not in the database: connections and push triggers.

A row's secret is at `<VAULT_PATH_PREFIX>/<VAULT_KIND>/<pk>` (relay.vault). It is written
after the row, inside the same transaction, so a Vault failure rolls the row back and leaves
nothing half done; it is deleted after the row's delete commits; and a secret whose row is
gone (Vault was down then, or a create's commit failed after its write) is deleted later by
relay.tasks.reconcile_vault_secrets, which finds the kinds here.
"""

import logging
from typing import ClassVar

from django.apps import apps
from django.db import models, transaction
from django.db.models.signals import class_prepared, post_delete
from django.dispatch import receiver
from django.views.decorators.debug import sensitive_variables

from relay import vault

log = logging.getLogger(__name__)


class VaultBacked(models.Model):
    """A row with a Vault secret of its own. Subclasses set VAULT_KIND (the folder)."""

    VAULT_KIND: ClassVar[str] = ""

    class Meta:
        abstract = True

    @property
    def vault_path(self) -> str:
        return vault.path_for(self.VAULT_KIND, self.pk)

    @sensitive_variables("values", "current")
    def write_secret(self, values: dict[str, str], creating: bool) -> None:
        """Store `values` in the row's secret: a new secret when `creating` (check-and-set 0,
        so an existing one is never overwritten), else merged over the newest version, which
        must still be the newest when it is written (check-and-set on its version).

        Call inside transaction.atomic(), after the row is saved: a VaultUnavailable then
        rolls the row back."""
        current, version = ({}, 0) if creating else vault.read_with_version(self.vault_path)
        vault.write(self.vault_path, {**current, **values}, cas=version)

    def read_secret(self) -> dict[str, str]:
        """The secret's newest values; {} when there is none."""
        return vault.read(self.vault_path) or {}


def vault_backed_models() -> list[type[VaultBacked]]:
    """Every kind of row with a Vault secret, for the reconciler."""
    return [model for model in apps.get_models() if issubclass(model, VaultBacked)]


@receiver(class_prepared)
def _connect_vault_cleanup(sender: type, **kwargs: object) -> None:
    """Listen for deletes of these rows only: a post_delete receiver for every model would
    stop Django's fast delete (one DELETE, rows never loaded) for all of them."""
    if issubclass(sender, VaultBacked) and not sender._meta.abstract:
        post_delete.connect(
            _delete_vault_secret, sender=sender, dispatch_uid=f"vault-cleanup-{sender._meta.label}"
        )


def _delete_vault_secret(sender: type, instance: VaultBacked, **kwargs: object) -> None:
    """A deleted row's secret goes too.

    A signal, not delete(), so admin bulk deletes and cascades from a deleted user count too.
    After commit, so a rolled-back delete keeps its secret. If Vault is down then, the row is
    gone anyway (a token holder's token has stopped working: its digest is gone) and
    relay.tasks.reconcile_vault_secrets removes the secret later."""
    path = instance.vault_path

    def purge() -> None:
        try:
            vault.delete(path)
        except vault.VaultUnavailable as exc:
            log.warning("vault secret %s left for the reconciler: %s", path, exc)

    transaction.on_commit(purge)
