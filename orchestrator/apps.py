from django.apps import AppConfig


class OrchestratorConfig(AppConfig):
    name = "orchestrator"
    verbose_name = "Stepwise orchestrator"

    def ready(self) -> None:
        from .tools import registry

        registry.load_tool_modules()
        from . import signals  # noqa: F401  (worker heartbeats)
