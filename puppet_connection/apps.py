from django.apps import AppConfig


class PuppetConnectionConfig(AppConfig):
    name = "puppet_connection"
    default_auto_field = "django.db.models.BigAutoField"
