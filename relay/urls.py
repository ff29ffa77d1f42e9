from django.contrib import admin
from django.http import HttpRequest, JsonResponse
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("api/", include("connections.api.urls")),
    path("api/", include("triggers.api.urls")),
    path("api/", include("workflows.api.urls")),
    path("_puppet/", include("runs.api.urls")),
    path("_puppet/", include("inventory.api.urls")),
    path("healthz", healthz, name="healthz"),
    # The workflow and run pages (the step runtime API below has /workflows/ of its own).
    path("app/", include("pages.urls")),
    # The step runtime API (relay-core's metadata API) for running steps, at the root.
    path("", include("stepruntime.urls")),
]

handler400 = "relay.api.problems.handler400"
handler403 = "relay.api.problems.handler403"
handler404 = "relay.api.problems.handler404"
handler500 = "relay.api.problems.handler500"
