from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html_join

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
        "backend",
        "puppetdb",
        "created",
        "last_used",
        "token_regenerated_at",
    ]
    list_filter = ["platform", "backend", "puppetdb", "created", "last_used"]
    editable_fields = ("name", "description", "owner", "platform", "backend", "puppetdb")
    add_form_fields = editable_fields
    readonly_fields = [
        "id",
        "token_prefix",
        "reported_platform",
        "reported_backend",
        "bridge_warnings",
        "created",
        "last_used",
        "token_regenerated_at",
    ]
    token_hint = "Put it in the Puppet module's relay_connection_token, or the bridge's relay.yaml."

    @admin.display(description="Bridge warnings")
    def bridge_warnings(self, obj: PuppetConnection) -> str:
        warnings = obj.bridge_warnings()
        if not warnings:
            return "None: the bridge's reports agree with the settings (or it sent none)."
        return format_html_join("", "<p>{}</p>", ((w,) for w in warnings))

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict | None = None
    ) -> HttpResponse:
        # At the top of the page too: a setting the bridge contradicts is worth a look.
        if request.method == "GET":
            connection = self.get_object(request, object_id)
            for warning in connection.bridge_warnings() if connection else []:
                self.message_user(request, warning, messages.WARNING)
        return super().change_view(request, object_id, form_url, extra_context)
