from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Puppet runs"  # apart from the workflows' runs
    default_auto_field = "django.db.models.BigAutoField"
