"""The Celery application. Configuration lives in Django settings under CELERY_*."""
import os

from celery import Celery
from celery.signals import setup_logging

from .operations import broker  # noqa: F401  (registers the embedded stepwisefs:// transport)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator.settings")

class Stepwise(Celery):
    """A task sent by name asks for no result unless its sender says otherwise.

    Nothing in Stepwise waits for a task's result, but `send_task` subscribes its sender to
    the task's result channel unless the send says `ignore_result`. On the Redis result
    backend that subscription needed Redis too: while Redis was down each send retried it for
    20 s and then failed, the reaper's re-sends of lost messages with it, and queued steps
    stayed queued after an outage (the fault suite; docs/failure-semantics.md). A task sent
    through its signature (a chord's header: a map's items, whose results the chord counts)
    keeps its own setting.
    """

    def send_task(self, name, args=None, kwargs=None, **options):
        options.setdefault("ignore_result", True)
        return super().send_task(name, args, kwargs, **options)


app = Stepwise("stepwise")
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
