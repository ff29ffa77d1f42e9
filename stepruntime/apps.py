from django.apps import AppConfig


class StepRuntimeConfig(AppConfig):
    name = "stepruntime"
    verbose_name = "Step runtime API"
    default_auto_field = "django.db.models.BigAutoField"
