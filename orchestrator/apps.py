from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps


class OrchestratorConfig(AppConfig):
    name = "orchestrator"
    verbose_name = "Stepwise orchestrator"

    def ready(self) -> None:
        # Imported once the app registry is ready (Django's way for code that needs models):
        # the tool modules the settings name (plugins, loaded by name), and the worker
        # heartbeat signals.
        from . import signals, tracing  # noqa: F401  (signals: connected on import)
        from .tools import registry

        registry.load_tool_modules()
        if tracing.enabled():  # STEPWISE_TRACING: spans to the configured exporter
            tracing.configure()


class StepwiseAdminConfig(admin_apps.AdminConfig):
    """Django's admin, served by Stepwise's site (reviewers may sign in without staff)."""

    default = False

    default_site = "orchestrator.admin_site.StepwiseAdminSite"
