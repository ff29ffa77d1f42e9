from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import formats, timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from connections.admin import ConnectionAdmin
from puppet_connection import setup
from puppet_connection.models import Platform, PuppetConnection
from relay.admin import TokenHolderAdmin


def _setting_and_report(setting: str, label: str, reported: str, reported_label: str) -> str:
    set_to = f"set to {label}" if setting else "not set"
    return f"{set_to}; the bridge says {reported_label if reported else 'nothing'}"


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
        "bridge",
        "bridge_warnings",
        "bridge_configuration",
        "fleet",
        "created",
        "last_used",
        "token_regenerated_at",
    ]
    token_hint = (
        "Put it in the bridge's configuration (relay-bridge's /etc/relay/bridge.yaml, or the Puppet "
        "module's relay_connection_token): the connection's page has it ready to paste, with a "
        "placeholder where this token goes."
    )

    @admin.display(description="Bridge")
    def bridge(self, obj: PuppetConnection) -> str:
        """What the bridge last said of itself, beside the settings; with no bridge heard from
        yet, how to set one up."""
        if obj.last_used is None:
            return mark_safe(
                "<p><strong>No bridge has called with this connection's token yet.</strong> Install "
                "relay-bridge on the Puppet server (<code>pip install ./bridge_client</code>) and give it "
                "the configuration below, or set the puppetlabs-relay module's class as shown; it then "
                "reports its platform and backend on every call.</p>"
            )
        platform = _setting_and_report(
            obj.platform,
            obj.get_platform_display(),
            obj.reported_platform,
            Platform(obj.reported_platform).label if obj.reported_platform else "",
        )
        backend = _setting_and_report(
            obj.backend, obj.get_backend_display(), obj.reported_backend, obj.reported_backend
        )
        agent = obj.reported_agent.replace("/", " ") or "it did not say"
        if obj.reported_agent.lower().startswith("ruby"):
            agent += " (the shipped puppetlabs-relay agent, which reports no platform or backend)"
        rows = [
            ("Last contact", formats.localize(timezone.template_localtime(obj.last_used))),
            ("Bridge", agent),
            ("Platform", platform),
            ("Backend", backend),
        ]
        table = format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", rows)
        note = ""
        if not obj.platform and not obj.reported_platform:
            note = mark_safe(
                "<p>Runs cannot be checked against a platform: set it above, or run relay-bridge, which "
                "reports it (the configuration below).</p>"
            )
        return format_html(
            '<table class="bridge">{}</table><p>The last contact is the token\'s last use, '
            "recorded at most once a minute.</p>{}",
            table,
            note,
        )

    @admin.display(description="Inventory")
    def fleet(self, obj: PuppetConnection) -> str:
        """The nodes its bridge sent from PuppetDB (the inventory app keeps them, through the
        reverse relations `inventory` and `nodes`), with links to them."""
        if obj.pk is None:
            return ""
        inventory = getattr(obj, "inventory", None)
        if inventory is None or inventory.synced_at is None:
            error = (
                f" The last sync failed: {inventory.last_error}" if inventory and inventory.last_error else ""
            )
            return format_html(
                "<p>No inventory yet: a bridge with <code>puppetdb_url</code> sends it from PuppetDB "
                "(docs/puppetdb.md).{}</p>",
                error,
            )
        nodes = reverse("admin:inventory_node_changelist") + f"?connection__id__exact={obj.pk}"
        return format_html(
            '<p><a href="{}">{} nodes</a>, last synced {}{}.</p>',
            nodes,
            obj.nodes.count(),
            formats.localize(timezone.template_localtime(inventory.synced_at)),
            format_html("; the last sync failed: {}", inventory.last_error) if inventory.last_error else "",
        )

    @admin.display(description="Bridge warnings")
    def bridge_warnings(self, obj: PuppetConnection) -> str:
        warnings = obj.bridge_warnings()
        if not warnings:
            return "None: the bridge's reports agree with the settings (or it sent none)."
        return format_html_join("", "<p>{}</p>", ((w,) for w in warnings))

    @admin.display(description="Bridge configuration")
    def bridge_configuration(self, obj: PuppetConnection) -> str:
        """Ready to paste, with this service's URL and a placeholder naming the token."""
        return format_html(
            '<p>relay-bridge\'s own file:</p><pre class="bridge-yaml">{}</pre>'
            "<p>or, on a Puppet server with the puppetlabs-relay module, its class (relay-bridge reads the "
            'relay.yaml it writes when there is no bridge.yaml):</p><pre class="module-class">{}</pre>'
            "<p>The token was shown once, when the connection was made; its owner can "
            "regenerate it, which stops the old one.</p>",
            setup.bridge_yaml(obj),
            setup.module_class(obj),
        )

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict | None = None
    ) -> HttpResponse:
        # At the top of the page too: a setting the bridge contradicts is worth a look.
        if request.method == "GET":
            connection = self.get_object(request, object_id)
            for warning in connection.bridge_warnings() if connection else []:
                self.message_user(request, warning, messages.WARNING)
        return super().change_view(request, object_id, form_url, extra_context)
