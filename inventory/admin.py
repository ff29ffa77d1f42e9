"""The inventory in the admin: nodes, filtered by connection, state, last report's status
and fact values (the allow-list's, by dotted path), and each connection's sync with a
"sync now" action. Read-only: the bridge's syncs write it. Whoever may see a connection
(connections.permissions) sees its nodes; no one else does."""

from django.contrib import admin, messages
from django.db.models import Count, QuerySet
from django.db.models.fields.json import KeyTextTransform
from django.http import HttpRequest

from connections.permissions import Action, connections_for, may
from inventory.models import Inventory, Node, State, state_filter
from puppet_connection.models import PuppetConnection

FACT_CHOICES = 10  # values offered per fact path in the filter
FACT_PATHS_SHOWN = 5


def seen_connections(request: HttpRequest) -> QuerySet[PuppetConnection]:
    return connections_for(request.user, PuppetConnection.objects.all())


class ReadOnly(admin.ModelAdmin):
    def has_module_permission(self, request: HttpRequest) -> bool:
        return request.user.is_active and request.user.is_staff

    def has_view_permission(self, request: HttpRequest, obj: Node | Inventory | None = None) -> bool:
        return obj is None or may(request.user, Action.VIEW, obj.connection)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


class StateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return list(State.choices)

    def queryset(self, request: HttpRequest, queryset: QuerySet[Node]) -> QuerySet[Node]:
        return queryset.filter(state_filter(self.value())) if self.value() in State.values else queryset


class FactFilter(admin.SimpleListFilter):
    """`fact=os.family=Debian`: the most common values of the allow-listed facts."""

    title = "fact value"
    parameter_name = "fact"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        inventories = Inventory.objects.filter(connection__in=seen_connections(request))
        paths = list(dict.fromkeys(p for i in inventories for p in i.fact_paths))[:FACT_PATHS_SHOWN]
        nodes = model_admin.get_queryset(request)
        choices = []
        for path in paths:
            values = (
                nodes.annotate(value=KeyTextTransform(path, "facts"))
                .exclude(value=None)
                .values("value")
                .annotate(n=Count("id"))
                .order_by("-n")[:FACT_CHOICES]
            )
            choices += [(f"{path}={v['value']}", f"{path}: {v['value']} ({v['n']})") for v in values]
        return choices

    def queryset(self, request: HttpRequest, queryset: QuerySet[Node]) -> QuerySet[Node]:
        path, _, value = (self.value() or "").partition("=")
        if not path:
            return queryset
        if "\x00" in path or "\x00" in value:
            return queryset.none()  # no fact holds a NUL, and PostgreSQL refuses one in a lookup (a 500)
        return queryset.alias(fact=KeyTextTransform(path, "facts")).filter(fact=value)


@admin.register(Node)
class NodeAdmin(ReadOnly):
    list_display = [
        "certname",
        "connection",
        "state",
        "report_status",
        "report_at",
        "environment",
        "facts_shown",
    ]
    # The connections offered are the ones whose nodes the user sees: the stock filter would
    # name every user's connections.
    list_filter = [
        StateFilter,
        "report_status",
        FactFilter,
        ("connection", admin.RelatedOnlyFieldListFilter),
        "environment",
    ]
    search_fields = ["certname"]
    list_select_related = ["connection"]
    readonly_fields = [*Node.SENT, "certname", "connection", "seen_at"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Node]:
        return super().get_queryset(request).filter(connection__in=seen_connections(request))

    @admin.display(description="state")
    def state(self, node: Node) -> str:
        return node.state

    @admin.display(description="facts")
    def facts_shown(self, node: Node) -> str:
        return ", ".join(f"{path}={value}" for path, value in node.facts.items())


@admin.register(Inventory)
class InventoryAdmin(ReadOnly):
    list_display = [
        "connection",
        "synced_at",
        "full_synced_at",
        "last_nodes",
        "sync_requested_at",
        "last_error",
    ]
    readonly_fields = [
        "connection",
        "fact_paths",
        "since",
        "synced_at",
        "full_synced_at",
        "sync_requested_at",
        "last_nodes",
        "last_error",
    ]
    actions = ["sync_now"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Inventory]:
        return super().get_queryset(request).filter(connection__in=seen_connections(request))

    @admin.action(description="Ask the bridge to sync now")
    def sync_now(self, request: HttpRequest, queryset: QuerySet[Inventory]) -> None:
        # Setting its bridge to work is a change, as the API's POST …/sync/ is: the owner's
        # or a superuser's (connections.permissions), not whoever may see the connection.
        asked, refused = [], []
        for inventory in queryset.select_related("connection"):
            mine = may(request.user, Action.CHANGE, inventory.connection)
            (asked if mine else refused).append(inventory)
        for inventory in asked:
            inventory.request_sync()
        if asked:
            self.message_user(request, f"Asked {len(asked)} bridge(s) to sync.", messages.SUCCESS)
        if refused:
            names = ", ".join(str(i.connection) for i in refused)
            self.message_user(
                request,
                f"Only a connection's owner or a superuser asks for its sync: not {names}.",
                messages.ERROR,
            )
