"""The Celery application. Configuration lives in Django settings under CELERY_*."""
import os

from celery import Celery
from celery.signals import setup_logging

from . import broker  # noqa: F401  (registers the embedded stepwisefs:// transport)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator.settings")

app = Celery("stepwise")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@setup_logging.connect
def use_django_logging(**kwargs) -> None:
    """Workers and beat log through the settings' LOGGING (ids, JSON, redaction), not through
    handlers of Celery's own: a receiver here tells Celery to leave logging alone, which also
    stops every line from being printed twice (Celery's root handler beside Django's)."""
    from django.conf import settings  # the settings are loaded by the time a worker logs
    from django.utils.log import configure_logging

    configure_logging(settings.LOGGING_CONFIG, settings.LOGGING)
