from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps


class OrchestratorConfig(AppConfig):
    name = "orchestrator"
    verbose_name = "Stepwise orchestrator"

    def ready(self) -> None:
        # Imported once the app registry is ready (Django's way for code that needs models):
        # the tool modules the settings name (plugins, loaded by name), the worker heartbeat
        # signals, and what the chosen store gives every new connection.
        from django.conf import settings

        from . import signals, store  # noqa: F401  (signals: connected on import)
        from .engine.definitions import limits
        from .integrations.tools import registry
        from .operations import tracing

        store.set_up()

        registry.load_tool_modules()
        # The render budget is a setting; definitions/ reads no settings itself.
        limits.MAX_RENDER_CHARS = settings.STEPWISE_TEMPLATE_MAX_CHARS
        limits.MAX_RENDER_SECONDS = settings.STEPWISE_TEMPLATE_MAX_SECONDS
        if tracing.enabled():  # STEPWISE_TRACING: spans to the configured exporter
            tracing.configure()


class StepwiseAdminConfig(admin_apps.AdminConfig):
    """Django's admin, served by Stepwise's site (reviewers may sign in without staff)."""

    default = False

    default_site = "orchestrator.web.admin_site.StepwiseAdminSite"
