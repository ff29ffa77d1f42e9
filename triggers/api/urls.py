from rest_framework.routers import SimpleRouter

from triggers.api.views import TriggerViewSet

router = SimpleRouter(use_regex_path=False)  # path converters: <uuid:pk>
router.register("triggers", TriggerViewSet, basename="trigger")
urlpatterns = router.urls
