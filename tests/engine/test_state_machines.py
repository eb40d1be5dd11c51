"""Every allowed and every forbidden transition of runs and steps (table-driven)."""
import itertools
from datetime import UTC, datetime, timedelta

import pytest
from django_fsm import TransitionNotAllowed

from orchestrator.engine.leases import lease_until
from orchestrator.engine.states import RUN_LIVE, STEP_OPEN, STEP_RECOVERABLE, in_order
from orchestrator.models import Run, RunState, StepAttempt, StepRun, StepState

RUN_ALLOWED = {
    "start": {("pending", "running")},
    "wait": {("running", "waiting")},
    "resume": {("waiting", "running"), ("paused", "running")},
    "pause": {("running", "paused"), ("waiting", "paused")},
    "request_cancel": {(s, "cancelling") for s in ("running", "waiting", "paused")},
    "cancel": {("pending", "cancelled"), ("cancelling", "cancelled")},
    "complete": {("running", "completed"), ("waiting", "completed")},
    "fail": {(s, "failed") for s in ("running", "waiting", "paused", "pending")},
    "time_out": {(s, "timed_out") for s in ("running", "waiting", "paused")},
    "compensate": {(s, "compensating") for s in ("running", "waiting", "paused", "cancelling")},
    "compensated": {("compensating", "failed")},
    "compensation_fail": {("compensating", "compensation_failed")},
    "reopen": {("failed", "running"), ("timed_out", "running")},
}
RUN_KWARGS = {"pause": {"reason": {}}, "complete": {"output": {}}, "fail": {"error": {}},
              "time_out": {"error": {}}, "compensate": {"error": {}},
              "compensation_fail": {"error": {}}}

STEP_ALLOWED = {
    "make_ready": {("blocked", "ready")},
    "carry": {("blocked", "completed")},
    "skip": {("blocked", "skipped"), ("ready", "skipped")},
    "enqueue": {("ready", "queued"), ("retrying", "queued")},
    "claim": {("queued", "running")},
    "await_event": {("ready", "waiting"), ("running", "waiting")},
    "await_time": {("ready", "waiting")},
    "await_signal": {("ready", "waiting")},
    "complete": {("running", "completed"), ("waiting", "completed")},
    "schedule_retry": {("running", "retrying"), ("waiting", "retrying")},
    "fail": {(s, "failed") for s in ("ready", "queued", "running", "waiting", "retrying")},
    "time_out": {(s, "timed_out") for s in ("queued", "running", "waiting", "retrying")},
    "cancel": {(s, "cancelled") for s in ("blocked", "ready", "queued", "retrying", "running", "waiting")},
    "redrive": {("failed", "queued"), ("timed_out", "queued")},
    "skip_failed": {("failed", "skipped"), ("timed_out", "skipped")},
    "reopen": {("cancelled", "blocked")},
}
STEP_KWARGS = {"make_ready": {"step_input": {}}, "carry": {"step_input": {}, "output": {}}, "skip": {"reason": "r"}, "enqueue": {"queue": "q"},
               "claim": {"worker": "w", "timeout_s": 5, "lease_s": 10}, "await_event": {"timeout_s": 5},
               "await_time": {"wake_at": None}, "await_signal": {"timeout_s": 5, "correlation_key": ""},
               "complete": {"output": {}}, "schedule_retry": {"error": {}, "at": None},
               "fail": {"error": {}}, "time_out": {"error": {}}, "cancel": {"reason": "r"},
               "redrive": {"queue": "q"}, "skip_failed": {"reason": "r"}}


def _transitions(model) -> set[str]:
    """Every method of `model` declared as a transition of its state field."""
    return {t.name for t in model._meta.get_field("state").get_all_transitions(model)}


def test_the_tables_name_every_declared_transition():
    """A transition added to a model without a row here would go untested."""
    assert set(RUN_ALLOWED) == _transitions(Run)
    assert set(STEP_ALLOWED) == _transitions(StepRun)


def _in_state(model, state):
    obj = model()
    obj.__dict__["state"] = state  # bypass protection: this builds fixtures, not transitions
    return obj


def _cases(allowed, states):
    for (method, pairs), source in itertools.product(allowed.items(), states):
        target = next((t for s, t in pairs if s == source), None)
        yield pytest.param(method, source, target, id=f"{method}-{source}")


@pytest.mark.parametrize("method, source, target", list(_cases(RUN_ALLOWED, RunState.values)))
def test_run_transition(method, source, target):
    run = _in_state(Run, source)
    call = getattr(run, method)
    if target is None:
        with pytest.raises(TransitionNotAllowed):
            call(**RUN_KWARGS.get(method, {}))
    else:
        call(**RUN_KWARGS.get(method, {}))
        assert run.state == target


@pytest.mark.parametrize("method, source, target", list(_cases(STEP_ALLOWED, StepState.values)))
def test_step_transition(method, source, target):
    step = _in_state(StepRun, source)
    call = getattr(step, method)
    if target is None:
        with pytest.raises(TransitionNotAllowed):
            call(**STEP_KWARGS.get(method, {}))
    else:
        call(**STEP_KWARGS.get(method, {}))
        assert step.state == target


def test_state_cannot_be_assigned_directly():
    run = Run()
    with pytest.raises(AttributeError):
        run.state = RunState.COMPLETED


def test_transition_sources_are_listed_in_declaration_order():
    """`in_order` runs when the models are declared; its result is what the tables above test."""
    assert in_order(RUN_LIVE) == [RunState.RUNNING, RunState.WAITING, RunState.PAUSED]
    assert in_order(STEP_RECOVERABLE) == [StepState.FAILED, StepState.TIMED_OUT]
    # Step states that runs have too ("running") must not make it read the run's states.
    assert in_order(STEP_OPEN) == [StepState.BLOCKED, StepState.READY, StepState.QUEUED,
                                   StepState.RUNNING, StepState.RETRYING, StepState.WAITING]
    assert in_order(frozenset({RunState.CANCELLED})) == [RunState.CANCELLED]


def test_an_attempt_says_how_it_ended():
    assert str(StepAttempt(number=2, step_id=5)) == "attempt 2 of step 5 (running)"
    assert str(StepAttempt(number=2, step_id=5, outcome="lost")) == "attempt 2 of step 5 (lost)"


def test_a_lease_runs_out_lease_s_after_it_was_taken(settings):
    settings.STEPWISE_LEASE_S = 30
    taken = datetime(2026, 1, 1, tzinfo=UTC)
    assert lease_until(taken) == taken + timedelta(seconds=30)
