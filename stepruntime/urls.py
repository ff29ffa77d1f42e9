"""relay-core's metadata API routes (pkg/metadataapi/server/api/server.go), at the URL root:
relay_sdk joins absolute paths onto METADATA_API_URL, so they cannot live under a prefix."""

from django.urls import path

from stepruntime import views

urlpatterns = [
    path("conditions", views.ConditionsView.as_view(), name="stepruntime-conditions"),
    path("decorators/<str:name>", views.DecoratorView.as_view(), name="stepruntime-decorator"),
    path("events", views.EventView.as_view(), name="stepruntime-events"),
    path("environment", views.EnvironmentView.as_view(), name="stepruntime-environment"),
    path(
        "environment/<str:name>",
        views.EnvironmentVariableView.as_view(),
        name="stepruntime-environment-variable",
    ),
    path("logs", views.LogView.as_view(), name="stepruntime-logs"),
    path("logs/<str:log_id>/messages", views.LogMessageView.as_view(), name="stepruntime-log-messages"),
    path("outputs/<str:name>", views.OutputView.as_view(), name="stepruntime-output"),
    path("outputs/<str:step>/<str:name>", views.StepOutputView.as_view(), name="stepruntime-step-output"),
    path("secrets/<str:name>", views.SecretView.as_view(), name="stepruntime-secret"),
    path("spec", views.SpecView.as_view(), name="stepruntime-spec"),
    path("status", views.StatusView.as_view(), name="stepruntime-status"),
    path("validate", views.ValidateView.as_view(), name="stepruntime-validate"),
    path("workflows/<str:name>/run", views.WorkflowRunView.as_view(), name="stepruntime-workflow-run"),
]
