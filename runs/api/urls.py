from django.urls import path

from runs.api.views import RunViewSet, StateParser

# The RFC's paths, which have no trailing slash.
urlpatterns = [
    path("runs", RunViewSet.as_view({"get": "list", "post": "create"}), name="run-list"),
    path("runs/<uuid:pk>", RunViewSet.as_view({"get": "retrieve"}), name="run-detail"),
    path("runs/<uuid:pk>/accept", RunViewSet.as_view({"post": "accept"}), name="run-accept"),
    path(
        "runs/<uuid:pk>/state",
        RunViewSet.as_view({"put": "state"}, parser_classes=[StateParser]),
        name="run-state",
    ),
    path("runs/<uuid:pk>/results", RunViewSet.as_view({"get": "results"}), name="run-results"),
    path("runs/<uuid:pk>/cancel", RunViewSet.as_view({"post": "cancel"}), name="run-cancel"),
]
