"""How the web process runs a request under ASGI (orchestrator/asgi.py, orchestrator/web/onethread.py):
its middleware in the request's one thread, and its leftovers freed by young collections."""
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient
from django.utils.deprecation import MiddlewareMixin

pytestmark = pytest.mark.django_db


def test_under_asgi_no_middleware_hands_its_work_between_the_event_loop_and_a_thread(monkeypatch):
    """An async-capable middleware run async hands `process_request` and `process_response`
    to a thread each time (`MiddlewareMixin.__acall__`); the chain runs sync instead."""
    handed = []
    original = MiddlewareMixin.__acall__

    async def counted(self, request):
        handed.append(type(self).__name__)
        return await original(self, request)

    monkeypatch.setattr(MiddlewareMixin, "__acall__", counted)
    # In a thread of its own: a test process running the browser tests keeps an event loop
    # running in this one.
    with ThreadPoolExecutor(1) as pool:
        response = pool.submit(async_to_sync(AsyncClient().get), "/api/v1/health/ready/").result()
    assert response.status_code == 200
    assert "Content-Security-Policy" in response and response["X-Frame-Options"] == "DENY"
    assert handed == []


def test_the_web_process_collects_young_objects_every_20000_allocations_with_its_startup_frozen():
    shown = subprocess.run(
        [sys.executable, "-c", "import gc, orchestrator.asgi; "
         "print(gc.get_threshold()[0], gc.get_freeze_count() > 0)"],
        capture_output=True, text=True, check=True).stdout.split()
    assert shown == ["20000", "True"]
