from django.apps import AppConfig


class PuppetConnectionConfig(AppConfig):
    name = "puppet_connection"
    verbose_name = "Puppet"  # the admin's heading, not the label PUPPET_CONNECTION
    default_auto_field = "django.db.models.BigAutoField"
