"""Egress limits through real worker processes: a huge response is refused, never stored five
times; a trickling server does not keep a worker busy past the step's timeout."""
import json

import pytest

from audit.models import AuditEntry
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Effect, Event, StepAttempt, StepRun
from tests.factories import SETUP
from tests.support.hostile_server import HostileServer

from .conftest import wait_for, wait_for_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def one_step(name: str, step: dict) -> dict:
    return {"name": name, "input_schema": {"type": "object"},
            "steps": [{"name": "call", "type": "tool", "tool": "http.request", **step}]}


def stored_bytes(run) -> int:
    """What the run left in the database: run, steps, events, effects and ledger entries."""
    rows = [run.input, run.output, run.error]
    rows += [[s.input, s.output, s.error] for s in StepRun.objects.filter(run=run)]
    rows += list(Event.objects.filter(run=run).values_list("payload", flat=True))
    rows += [[e.result, e.error] for e in Effect.objects.filter(run=run)]
    size = len(json.dumps(rows, default=str))
    return size + sum(len(p) for p in AuditEntry.objects.filter(run_id=run.id)
                      .values_list("payload", flat=True))


def test_a_40_mb_response_fails_the_step_and_is_stored_nowhere(workers, team):
    with HostileServer() as server:
        version, _ = workflow_save(team=team, definition=one_step("huge", {
            "side_effect": True, "params": {"method": "POST", "url": f"{server.url}/big?mb=40"}}), actor=SETUP)
        run = wait_for_run(run_start(version=version, input={}, actor=SETUP).id, states=("failed",))
    step = StepRun.objects.get(run=run, name="call")
    assert step.error["class"] == "permanent"
    assert "max_response_bytes" in step.error["message"]
    assert stored_bytes(run) < 64 * 1024


def test_a_trickling_server_frees_the_worker_at_the_steps_timeout(workers, team):
    with HostileServer() as server:
        version, _ = workflow_save(team=team, definition=one_step("trickle", {
            "timeout_s": 2, "params": {"url": f"{server.url}/trickle?bytes=40&every=0.25"}}), actor=SETUP)
        run = wait_for_run(run_start(version=version, input={}, actor=SETUP).id,
                           states=("failed", "timed_out", "completed"))
        # The worker hung up when the step's time was up, not when the server was done (10 s).
        hung_up = wait_for(lambda: server.finished, timeout=3)
    assert hung_up == [{"path": "/trickle", "broken": True}]
    attempt = StepAttempt.objects.get(step__run=run, step__name="call", number=1)
    assert attempt.error_class == "timeout" and "deadline of 2 s" in attempt.error_message
