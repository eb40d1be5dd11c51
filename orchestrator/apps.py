from django.apps import AppConfig


class OrchestratorConfig(AppConfig):
    name = "orchestrator"
    verbose_name = "Stepwise orchestrator"

    def ready(self) -> None:
        # Imported once the app registry is ready (Django's way for code that needs models):
        # the tool modules the settings name (plugins, loaded by name), and the worker
        # heartbeat signals.
        from . import signals  # noqa: F401
        from .tools import registry

        registry.load_tool_modules()
