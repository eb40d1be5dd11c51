"""Written before acting: a worker killed after the ledger authorized a call, while the call is
under way, leaves the committed evidence behind — and the chain still verifies.

A real `celery worker` process is started on a queue of its own (a model only it serves), so
no other worker of the test session can take the step, and is killed with SIGKILL.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from audit.chain import verify_ledger
from audit.models import AuditEntry
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import StepRun
from tests.factories import SETUP
from tests.integration.conftest import ROOT, wait_for, worker_env

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
MODEL = "auditcrash"


class LoneWorker:
    """One worker process consuming only `agent.<MODEL>`."""

    def __init__(self, models: dict):
        self.log = Path(django_settings.VAR_DIR) / "itest-worker-auditcrash.log"
        env = {**worker_env(), "STEPWISE_MODELS": json.dumps(models)}
        cmd = [sys.executable, "-m", "celery", "-A", "orchestrator", "worker", "-Q", f"agent.{MODEL}",
               "-c", "1", "-P", "prefork", "--without-mingle", "--without-gossip",
               "--without-heartbeat", "-n", f"{MODEL}@%h", "-l", "info"]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log.open("w"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(lambda: "ready." in self.log.read_text() or self.proc.poll() is not None, timeout=60)
        if self.proc.poll() is not None:
            raise RuntimeError(f"worker exited: {self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def lone_worker(settings):
    models = {**settings.STEPWISE_MODELS, MODEL: {"provider": "scripted"}}
    settings.STEPWISE_MODELS = models
    worker = LoneWorker(models)
    yield worker
    worker.kill()


def test_a_worker_killed_during_an_authorized_call_leaves_the_entry(lone_worker, team):
    version, _ = workflow_save(team=team, definition={
        "name": "slow-model", "input_schema": {"type": "object"}, "steps": [{
            "name": "think", "type": "agent", "model": MODEL, "prompt": "think hard",
            "timeout_s": 120, "output_schema": {"type": "object"},
            "script": [{"output": {}, "delay_ms": 60000}]}]}, actor=SETUP)
    run = run_start(version=version, input={}, actor=SETUP)

    authorized = wait_for(lambda: AuditEntry.objects.filter(
        run_id=run.id, action="external_call.authorized", sequence__isnull=False).first(), timeout=60)
    time.sleep(0.2)  # the worker is now inside the (slow) model call
    lone_worker.kill()

    entry = AuditEntry.objects.get(id=authorized.id)
    assert entry.idempotency_key == f"{run.id}:think:default"
    assert entry.data["kind"] == "model" and entry.data["target"] == f"scripted:{MODEL}"
    assert entry.data["attempt"] == 1 and entry.actor.startswith("worker:")
    assert entry.prev_hash and entry.hash  # committed and chained, not waiting for anything
    actions = list(AuditEntry.objects.filter(run_id=run.id).order_by("sequence")
                   .values_list("action", flat=True))
    assert actions[-2:] == ["step.running", "external_call.authorized"]
    assert StepRun.objects.get(run=run, name="think").state == "running"  # the outcome never came
    report = verify_ledger()
    assert report.ok, report.broken
