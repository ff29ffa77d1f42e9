from django.urls import path
from rest_framework.routers import SimpleRouter

from triggers.api.views import EventIngestView, EventViewSet, TriggerViewSet, WebhookIngestView

router = SimpleRouter(use_regex_path=False)  # path converters: <uuid:pk>
router.register("triggers", TriggerViewSet, basename="trigger")
urlpatterns = router.urls
urlpatterns += [
    # The doors: where Puppet's report processors and webhook senders post.
    path("events", EventIngestView.as_view(), name="events"),
    path("webhooks/<uuid:trigger_id>/", WebhookIngestView.as_view(), name="webhook"),
    path(
        "triggers/<uuid:trigger_pk>/events/", EventViewSet.as_view({"get": "list"}), name="trigger-event-list"
    ),
    path(
        "triggers/<uuid:trigger_pk>/events/<uuid:pk>/",
        EventViewSet.as_view({"get": "retrieve", "delete": "destroy"}),
        name="trigger-event-detail",
    ),
    path(
        "triggers/<uuid:trigger_pk>/events/<uuid:pk>/parts/<str:name>",
        EventViewSet.as_view({"get": "part"}),
        name="trigger-event-part",
    ),
]
