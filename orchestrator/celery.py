"""The Celery application. Configuration lives in Django settings under CELERY_*."""
import os

from celery import Celery

from . import broker  # noqa: F401  (registers the embedded stepwisefs:// transport)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator.settings")

app = Celery("stepwise")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
