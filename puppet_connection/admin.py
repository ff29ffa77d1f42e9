from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from puppet_connection.models import PuppetConnection
from relay.admin import TokenHolderAdmin


@admin.register(PuppetConnection)
class PuppetConnectionAdmin(TokenHolderAdmin):
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
    search_fields = ["name", "description", "owner__username", "token_lookup"]
    readonly_fields = [
        "id",
        "token_prefix",
        "platform",
        "bridge_backend",
        "created",
        "last_used",
        "token_regenerated_at",
    ]
    autocomplete_fields = ["owner"]
    token_hint = "Put it in the Puppet module's relay_connection_token, or the bridge's relay.yaml."

    def get_fields(self, request: HttpRequest, obj: PuppetConnection | None = None) -> list[str]:
        if obj is None:
            return ["name", "description", "owner"]
        return ["name", "description", "owner", *self.readonly_fields]

    def get_readonly_fields(self, request: HttpRequest, obj: PuppetConnection | None = None) -> list[str]:
        # The owner is chosen once; moving a connection would hand its token to another user.
        return [*self.readonly_fields, "owner"] if obj else []

    def get_queryset(self, request: HttpRequest) -> QuerySet[PuppetConnection]:
        return super().get_queryset(request).select_related("owner")
