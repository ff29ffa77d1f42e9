from django.urls import path

from workflows.api.views import WorkflowRunViewSet, WorkflowValidateView, WorkflowViewSet

workflows = WorkflowViewSet.as_view({"get": "list", "post": "create"})
workflow = WorkflowViewSet.as_view({"get": "retrieve", "put": "update", "delete": "destroy"})
runs = WorkflowRunViewSet.as_view({"get": "list"})
run = WorkflowRunViewSet.as_view({"get": "retrieve"})

urlpatterns = [
    path("workflows/validate", WorkflowValidateView.as_view(), name="workflow-validate"),
    path("workflows/", workflows, name="workflow-list"),
    path("workflows/<str:name>/", workflow, name="workflow-detail"),
    path(
        "workflows/<str:name>/revisions/",
        WorkflowViewSet.as_view({"get": "revisions"}),
        name="workflow-revisions",
    ),
    path("workflows/<str:name>/runs/", WorkflowViewSet.as_view({"post": "runs"}), name="workflow-runs"),
    path(
        "workflows/<str:name>/secrets/<str:secret>/",
        WorkflowViewSet.as_view({"put": "put_secret", "delete": "delete_secret"}),
        name="workflow-secret",
    ),
    path("workflow-runs/", runs, name="workflow-run-list"),
    path("workflow-runs/<uuid:pk>/", run, name="workflow-run-detail"),
    path(
        "workflow-runs/<uuid:pk>/cancel/",
        WorkflowRunViewSet.as_view({"post": "cancel"}),
        name="workflow-run-cancel",
    ),
    path(
        "workflow-runs/<uuid:pk>/steps/<str:step>/approve/",
        WorkflowRunViewSet.as_view({"post": "approve"}),
        name="workflow-run-approve",
    ),
    path(
        "workflow-runs/<uuid:pk>/steps/<str:step>/log",
        WorkflowRunViewSet.as_view({"get": "log"}),
        name="workflow-run-step-log",
    ),
    path(
        "workflow-runs/<uuid:pk>/steps/<str:step>/reject/",
        WorkflowRunViewSet.as_view({"post": "reject"}),
        name="workflow-run-reject",
    ),
]
