from django.contrib.auth import views as auth_views
from django.urls import path
from django.views.generic import RedirectView

from pages import views

app_name = "pages"

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="pages:workflows"), name="home"),
    path(
        "login/",
        auth_views.LoginView.as_view(
            template_name="admin/login.html",
            next_page="pages:workflows",  # without ?next=
            extra_context={"site_header": "Relay for Puppet", "site_title": "Relay", "title": "Log in"},
        ),
        name="login",
    ),
    path("workflows/", views.workflow_list, name="workflows"),
    path("workflows/<uuid:workflow_id>/", views.workflow_detail, name="workflow"),
    path("workflows/<uuid:workflow_id>/run/", views.run_form, name="run-form"),
    path("runs/<uuid:run_id>/", views.run_detail, name="run"),
    path("runs/<uuid:run_id>/live/", views.run_live, name="run-live"),
    path("runs/<uuid:run_id>/cancel/", views.cancel, name="run-cancel"),
    path("runs/<uuid:run_id>/delete/", views.delete_run, name="run-delete"),
    path("runs/<uuid:run_id>/steps/<str:step>/", views.run_step, name="run-step"),
    path("runs/<uuid:run_id>/steps/<str:step>/approve/", views.answer, {"approve": True}, name="approve"),
    path("runs/<uuid:run_id>/steps/<str:step>/reject/", views.answer, {"approve": False}, name="reject"),
]
