from rest_framework.routers import SimpleRouter

from puppet_connection.api.views import PuppetConnectionViewSet

router = SimpleRouter(use_regex_path=False)  # path converters: <uuid:pk>
router.register("connections/puppet", PuppetConnectionViewSet, basename="puppet-connection")
urlpatterns = router.urls
