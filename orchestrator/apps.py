from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps


class OrchestratorConfig(AppConfig):
    name = "orchestrator"
    verbose_name = "Stepwise orchestrator"

    def ready(self) -> None:
        # Imported once the app registry is ready (Django's way for code that needs models):
        # the tool modules the settings name (plugins, loaded by name), the worker heartbeat
        # signals, and the C timestamp loader every new PostgreSQL connection is given.
        from django.db.backends.signals import connection_created

        from . import signals, tracing  # noqa: F401  (signals: connected on import)
        from .compiled import read_timestamps_in_c
        from .tools import registry

        connection_created.connect(read_timestamps_in_c, dispatch_uid="stepwise-timestamps")

        registry.load_tool_modules()
        if tracing.enabled():  # STEPWISE_TRACING: spans to the configured exporter
            tracing.configure()


class StepwiseAdminConfig(admin_apps.AdminConfig):
    """Django's admin, served by Stepwise's site (reviewers may sign in without staff)."""

    default = False

    default_site = "orchestrator.admin_site.StepwiseAdminSite"
