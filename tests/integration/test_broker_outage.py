"""A worker keeps its place when the Redis broker goes away under it and comes back.

The broker sits behind a TCP proxy the test cuts, so a real worker process loses its broker
connection while it runs a task (unacknowledged, acks_late) without disturbing the Redis
server other tests share. Redis only: the embedded broker has no connection to lose.
"""
import time
from urllib.parse import urlparse

import pytest
from django.conf import settings

from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import StepRun
from tests.factories import SETUP
from tests.support.tcp_proxy import TcpProxy

from .conftest import WorkerGroup, wait_for, wait_for_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def proxied_worker(django_db_setup):
    url = urlparse(settings.CELERY_BROKER_URL)
    if not url.scheme.startswith("redis"):
        pytest.skip("the embedded broker has no connection to lose")
    with TcpProxy(url.hostname, url.port or 6379) as proxy:
        via_proxy = f"{url.scheme}://{url.hostname}:{proxy.port}{url.path}"
        group = WorkerGroup("proxied", env={"CELERY_BROKER_URL": via_proxy})
        group.start()
        yield group, proxy
        group.stop()


def test_a_worker_survives_losing_the_broker_mid_task_and_the_run_completes(proxied_worker, team):
    group, proxy = proxied_worker
    version, _ = workflow_save(team=team, definition={
        "name": "think-through-outage", "input_schema": {"type": "object"}, "steps": [
            {"name": "think", "type": "agent", "model": "fast", "prompt": "think",
             "output_schema": {"type": "object"}, "script": [{"output": {}, "delay_ms": 1500}]},
            {"name": "answer", "type": "tool", "tool": "core.echo", "after": ["think"]}]}, actor=SETUP)
    run = run_start(version=version, input={}, actor=SETUP)
    wait_for(lambda: StepRun.objects.filter(run=run, name="think", state="running").exists())
    proxy.cut()  # the broker is gone while "think" runs, its message unacknowledged
    time.sleep(2)
    assert group.proc.poll() is None, f"the worker exited: {group.log.read_text()[-2000:]}"
    proxy.resume()
    run = wait_for_run(run.id, states=("completed", "failed"), timeout=60)
    assert run.state == "completed", run.error
    assert group.proc.poll() is None
