from django.urls import path

from workflows.api.views import WorkflowValidateView

urlpatterns = [
    path("workflows/validate", WorkflowValidateView.as_view(), name="workflow-validate"),
]
