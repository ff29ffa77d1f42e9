from django.apps import AppConfig


class ScriptStepsConfig(AppConfig):
    name = "scriptsteps"
    verbose_name = "Script steps"
    default_auto_field = "django.db.models.BigAutoField"
