from django.urls import path
from rest_framework.routers import SimpleRouter

from triggers.api.views import EventViewSet, TriggerViewSet

router = SimpleRouter(use_regex_path=False)  # path converters: <uuid:pk>
router.register("triggers", TriggerViewSet, basename="trigger")
urlpatterns = router.urls
urlpatterns += [
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
