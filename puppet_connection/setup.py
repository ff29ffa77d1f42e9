"""How a connection's bridge is set up: the configuration to paste, filled with this service's
URL (RELAY_PUBLIC_URL) and the connection's settings, never its token. The token was shown
once, when the connection was made (or regenerated); the text names the one to use by its
visible part (`rlyp_<lookup>…`). The connection's admin page shows these."""

from django.conf import settings

from puppet_connection.models import Backend, PuppetConnection

BRIDGE_CONFIG = "/etc/relay/bridge.yaml"


def token_placeholder(connection: PuppetConnection) -> str:
    """What stands where the token goes: never a token, and plainly not one."""
    return f"<the token of connection {connection.name}, {connection.token_prefix}…>"


def bridge_yaml(connection: PuppetConnection) -> str:
    """relay-bridge's configuration file (bridge_client: relay_bridge.config), whose keys are
    the module's relay.yaml keys."""
    lines = [
        f"# {BRIDGE_CONFIG} on the Puppet server, mode 0600 (relay-bridge reads it as root)",
        f"relay_api_url: {settings.RELAY_PUBLIC_URL}/",
        f'relay_connection_token: "{token_placeholder(connection)}"',
    ]
    if connection.backend:
        lines.append(f"backend: {connection.backend}")
    else:
        lines.append(
            "# backend: orchestrator, bolt or ssh (unset: the orchestrator on a PE primary, else bolt"
            " when it is on PATH, else ssh)"
        )
    if connection.backend == Backend.SSH:
        lines += ["backend_ssh_user: root", "backend_ssh_identity_file: /etc/relay/id_ed25519"]
    if connection.puppetdb:
        lines.append("puppetdb_url: https://puppetdb.example.com:8081  # your PuppetDB, for query scopes")
    lines.append("state_dir: /var/lib/relay-bridge")
    return "\n".join(lines) + "\n"


def module_class(connection: PuppetConnection) -> str:
    """The shipped puppetlabs-relay module's class, which writes relay.yaml; relay-bridge reads
    that file as it is when there is no bridge.yaml, as does the module's own agent."""
    lines = [
        "class { 'relay':",
        f"  relay_api_url          => '{settings.RELAY_PUBLIC_URL}/',",
        f"  relay_connection_token => Sensitive('{token_placeholder(connection)}'),",
    ]
    if connection.backend:
        lines.append(f"  backend                => '{connection.backend}',")
    lines.append("}")
    return "\n".join(lines) + "\n"
