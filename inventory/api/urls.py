from django.urls import path

from inventory.api.views import InventoryView, QueriesView, SyncDoneView, SyncNodesView, SyncsView

# Beside /_puppet/runs, without trailing slashes as the RFC's paths.
urlpatterns = [
    path("inventory", InventoryView.as_view(), name="inventory"),
    path("inventory/queries", QueriesView.as_view(), name="inventory-queries"),
    path("inventory/syncs", SyncsView.as_view(), name="inventory-syncs"),
    path("inventory/syncs/<uuid:pk>/nodes", SyncNodesView.as_view(), name="inventory-sync-nodes"),
    path("inventory/syncs/<uuid:pk>/done", SyncDoneView.as_view(), name="inventory-sync-done"),
]
