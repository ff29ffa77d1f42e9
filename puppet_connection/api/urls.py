from rest_framework.routers import SimpleRouter

from puppet_connection.api.views import PuppetConnectionViewSet

router = SimpleRouter()
router.register("connections/puppet", PuppetConnectionViewSet, basename="puppet-connection")
urlpatterns = router.urls
