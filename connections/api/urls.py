"""`/api/connections/<type>/`: every connection type's API."""

from rest_framework.routers import SimpleRouter

from connections.api.views import SlackConnectionViewSet
from puppet_connection.api.views import PuppetConnectionViewSet

VIEWSETS = [PuppetConnectionViewSet, SlackConnectionViewSet]

router = SimpleRouter(use_regex_path=False)  # path converters: <uuid:pk>
for viewset in VIEWSETS:
    kind = viewset.queryset.model.TYPE
    router.register(f"connections/{kind}", viewset, basename=f"{kind}-connection")
urlpatterns = router.urls
