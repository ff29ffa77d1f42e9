from django.urls import path

from runs.api.views import RunListView

urlpatterns = [path("runs", RunListView.as_view(), name="run-list")]
