from django.apps import AppConfig


class PagesConfig(AppConfig):
    """The pages a user goes to for workflows and runs: server-rendered, with the admin's login
    and workflows.permissions' rules (the API's and the admin's) unchanged."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "pages"

    def ready(self) -> None:
        from django.contrib import admin

        # The admin's "View site" link: these pages (the service's root has none).
        admin.site.site_url = "/app/workflows/"
        admin.site.site_header = "Relay for Puppet"  # not "Django administration"
        admin.site.site_title = "Relay for Puppet admin"
        admin.site.index_title = "Administration"
