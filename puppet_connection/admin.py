from django.contrib import admin

from connections.admin import ConnectionAdmin
from puppet_connection.models import PuppetConnection
from relay.admin import TokenHolderAdmin


@admin.register(PuppetConnection)
class PuppetConnectionAdmin(ConnectionAdmin, TokenHolderAdmin):
    list_display = [
        "name",
        "owner",
        "token_prefix",
        "platform",
        "created",
        "last_used",
        "token_regenerated_at",
    ]
    list_filter = ["platform", "created", "last_used"]
    readonly_fields = [
        "id",
        "token_prefix",
        "platform",
        "bridge_backend",
        "created",
        "last_used",
        "token_regenerated_at",
    ]
    token_hint = "Put it in the Puppet module's relay_connection_token, or the bridge's relay.yaml."
