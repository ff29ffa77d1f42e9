from django.apps import AppConfig
from django.conf import settings


class ScriptStepsConfig(AppConfig):
    name = "scriptsteps"
    verbose_name = "Script steps"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from scriptsteps.handler import ContainerStep, ScriptStep
        from workflows.steps import registry

        # relaysh/core (any tag) in the sandbox, and with a container runtime every other image
        # no step kind runs: the engine's registry imports no kind.
        registry.register(ScriptStep.image, ScriptStep)
        if settings.STEP_CONTAINER_RUNTIME:
            registry.register_fallback(ContainerStep)
