"""A cancel that meets a worker moving one of the run's steps (PostgreSQL's row locks).

`run_cancel` locks the run, then the steps it stops. A worker's claim does not lock the run: it
moves the step under the step's own row lock. When the two meet, the cancel must wait for the
claim and see the step as the claim left it (running: it stops at its next safe point), not
write over it from what it read before and fail with `ConcurrentTransition`, which the API and
the admin would answer as a server error.
"""
import threading
import time

import pytest
from django.db import connection, connections, transaction

from orchestrator.engine.services.kinds.worker import step_claim
from orchestrator.engine.services.runs import run_cancel, run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import RunState, StepRun, StepState
from tests.factories import SETUP

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql",
                       reason="SQLite has no row locks: a writer waits for the whole database"),
]


def _waiting_on_a_lock(pid: int) -> bool:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cursor.fetchone()
    return bool(row) and row[0] == "Lock"


def _in_thread(work, done: dict, name: str) -> threading.Thread:
    def target():
        try:
            done["pid"] = connection.cursor().connection.info.backend_pid
            done[name] = work()
        except Exception as exc:  # the test asserts on it
            done[name] = exc
        finally:
            connection.close()
    thread = threading.Thread(target=target, name=name)
    thread.start()
    return thread


def test_a_cancel_meeting_a_claim_in_flight_waits_and_leaves_the_claimed_step_running(team):
    version, _ = workflow_save(team=team, definition={
        "name": "raced", "input_schema": {"type": "object"},
        "steps": [{"name": "work", "type": "tool", "tool": "core.echo"}]}, actor=SETUP)
    run = run_start(version=version, input={}, actor=SETUP)
    step = StepRun.objects.get(run=run, name="work")
    assert step.state == StepState.QUEUED

    claimed, release, worker, canceller = threading.Event(), threading.Event(), {}, {}

    def claim_and_hold():
        with transaction.atomic():  # the claim's writes stay uncommitted, its row lock held
            claim = step_claim(step_id=step.id, worker="w1")
            claimed.set()
            release.wait(30)
        return claim

    worker_thread = _in_thread(claim_and_hold, worker, "claim")
    assert claimed.wait(30), worker
    cancel_thread = _in_thread(lambda: run_cancel(run_id=run.id, actor=SETUP), canceller, "cancel")
    deadline = time.monotonic() + 30
    while not ("pid" in canceller and _waiting_on_a_lock(canceller["pid"])):
        assert time.monotonic() < deadline and cancel_thread.is_alive(), canceller
        time.sleep(0.02)
    release.set()
    worker_thread.join(30)
    cancel_thread.join(30)

    assert worker["claim"] is not None
    assert not isinstance(canceller["cancel"], Exception), repr(canceller["cancel"])
    step.refresh_from_db()
    run.refresh_from_db()
    assert step.state == StepState.RUNNING  # the claim stands; the step stops at its next safe point
    assert run.state == RunState.CANCELLING
