"""Fencing tokens with real worker processes: a worker paused (SIGSTOP) past its lease while in
the middle of a call, whose step the reaper then gave to another worker, is resumed and
records nothing — no second result, no second cost, no second effect at a remote that checks
the fencing token (docs/failure-semantics.md, "Fencing")."""
import os
import signal
from decimal import Decimal

import pytest

from orchestrator.engine.services import reaper
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Effect, Event, Run, StepAttempt, StepRun
from tests.factories import SETUP
from tests.support.http_sink import HttpSink

from .conftest import WorkerGroup, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def payment(sink_url: str) -> dict:
    return {"name": "fenced-pay", "input_schema": {"type": "object"}, "steps": [
        {"name": "pay", "type": "tool", "tool": "http.request", "side_effect": True,
         "retry": {"max_attempts": 3, "base_s": 0.2, "max_s": 0.5},
         "params": {"method": "POST", "url": f"{sink_url}/pay", "json": {"order": "o-1"}}},
        {"name": "receipt", "type": "tool", "tool": "core.echo", "after": ["pay"],
         "params": {"paid": "{{ steps.pay.output.status }}"}},
    ]}


def test_a_worker_resumed_after_its_lease_expired_records_nothing_and_its_stale_call_is_refused(
        workers, team, settings):
    settings.STEPWISE_REDISPATCH_AFTER_S = 2  # a retry message the paused worker took is re-sent
    with HttpSink(fenced=True) as sink:
        first_call = sink.hold_next("/pay")  # held, unanswered, until the test lets it act
        version, _ = workflow_save(team=team, definition=payment(sink.url), actor=SETUP)
        run = run_start(version=version, input={}, actor=SETUP)
        wait_for(lambda: sink.in_flight["/pay"] == 1, timeout=60)
        pay = StepRun.objects.get(run=run, name="pay")
        # Mid-call: the whole worker (its heartbeat thread included) stops; its lease runs out.
        os.killpg(workers.proc.pid, signal.SIGSTOP)
        other = WorkerGroup("fencing-other")
        try:
            other.start()

            def completed() -> bool:
                reaper.reap()  # as beat would: the lost attempt is retried, on the other worker
                return Run.objects.get(id=run.id).state == "completed"
            wait_for(completed, timeout=90, interval=0.3)
            # The remote acts on the stale request only now, after the newer attempt's.
            first_call.set()
            wait_for(lambda: sink.stale_refused or sink.calls_by_key[pay_key(pay)] > 1, timeout=30)
        finally:
            os.killpg(workers.proc.pid, signal.SIGCONT)
        try:
            # The resumed worker reads its answer and tries to record its attempt: refused.
            wait_for(lambda: StepAttempt.objects.filter(step=pay, number=1).exclude(
                finished_at=None).exclude(outcome="lost").exists(), timeout=60)
        finally:
            other.stop()  # never left consuming the session's queues

    key = pay_key(pay)
    assert sink.calls_by_key[key] == 1, "the remote acted on the stale worker's call too"
    assert sink.stale_refused == [(key, 1)]
    effect = Effect.objects.get(key=key)
    assert (effect.status, effect.fence, effect.attempts) == ("succeeded", 2, 2)
    assert effect.result["body"] == {"ok": True, "duplicate": False}
    assert Event.objects.filter(run=run, kind="effect.succeeded").count() == 1
    attempts = dict(StepAttempt.objects.filter(step=pay).values_list("number", "outcome"))
    assert attempts == {1: "stale", 2: "succeeded"}
    assert Event.objects.filter(run=run, kind="step.completed", step=pay).count() == 1
    finished = Run.objects.get(id=run.id)
    pay.refresh_from_db()
    assert (pay.state, pay.attempts, pay.output["status"]) == ("completed", 2, 200)
    assert finished.state == "completed" and finished.cost_usd == Decimal("0")
    assert StepRun.objects.get(run=run, name="receipt").state == "completed"


def pay_key(step: StepRun) -> str:
    return f"{step.run_id}:pay:default"
