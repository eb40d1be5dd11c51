"""Stopping a running agent, tool or router step from outside its worker
(orchestrator/engine/services/kinds/worker.py `step_stop`, reached through the run's deadline), and
what a started step records.

A run past its `budget.max_duration_s` has its running step stopped by the reaper: that
step's own attempt ends `stopped` at that instant with the reason, every other attempt is left
alone, and what the step had reserved is released. Under the `pause` policy the step is held
(`retrying`, its retry not spent, the event naming the attempt); under `fail` it is cancelled
with the reason. `step_stop` reports True when it stopped the step and False, changing
nothing, for a step that is not running. A started step's `step.queued` event names its queue.
"""
import pytest

from budgets.models import Reservation
from orchestrator.engine.authz import REAPER
from orchestrator.engine.clock import now
from orchestrator.engine.services.kinds.worker import step_claim, step_stop
from orchestrator.engine.services.runs import run_over_duration, run_time_out
from orchestrator.models import Event, Run, StepAttempt
from tests.engine.test_worker import AGENT, echo, events, start, step_of

pytestmark = pytest.mark.django_db

LATE = "elapsed 31s exceeds the budget of 30s"  # the reason a run 31 s into 30 s is paused for


def _late_agent(team, move_clock, *, on_duration: str) -> Run:
    """A run whose agent step is running, with its attempt's cost reserved, 31 s into a 30 s
    budget; beside it, another run's step running its attempt 1 too."""
    run = start(team, AGENT, budget={"max_cost_usd": 10, "max_duration_s": 30,
                                     "on_duration": on_duration})
    step_claim(step_id=step_of(run, "think").id, worker="w")
    other = start(team, echo(), name="other")
    step_claim(step_id=step_of(other).id, worker="w")
    move_clock(31)
    return run


STOPS = [
    pytest.param("pause", lambda run: run_over_duration(run_id=run.id), "retrying", LATE, id="held"),
    pytest.param("fail", lambda run: run_time_out(run_id=run.id), "cancelled", "run timed out",
                 id="cancelled"),
]


@pytest.mark.parametrize(("on_duration", "reap", "state", "reason"), STOPS)
def test_a_step_stopped_at_its_run_deadline_ends_its_own_attempt_then_and_frees_its_reservation(
        team, move_clock, on_duration, reap, state, reason):
    run = _late_agent(team, move_clock, on_duration=on_duration)
    assert Reservation.objects.get(step=step_of(run, "think")).state == "reserved"

    reap(run)

    step = step_of(run, "think")
    assert step.state == state
    attempt = StepAttempt.objects.get(step=step)
    assert (attempt.outcome, attempt.error_class, attempt.error_message) == ("stopped", "budget", reason)
    assert attempt.finished_at == now()
    reservation = Reservation.objects.get(step=step)
    assert (reservation.attempt, reservation.state) == (1, "released")
    running = StepAttempt.objects.get(step__run__version__workflow__name="other")
    assert (running.outcome, running.finished_at, running.error_message) == ("", None, "")


def test_a_step_held_at_its_run_deadline_waits_retrying_with_the_reason_and_its_attempt(
        team, move_clock):
    run = _late_agent(team, move_clock, on_duration="pause")

    assert run_over_duration(run_id=run.id) == "paused"

    step = step_of(run, "think")
    assert (step.state, step.error, step.attempts) == ("retrying", {"class": "budget", "message": LATE}, 1)
    assert step.next_attempt_at == now()  # due at once, once the run is resumed
    [held] = events(step, "step.retrying")
    assert (held.actor, held.payload) == ("service:reaper", {"class": "budget", "message": LATE,
                                                             "attempt": 1, "held": True})


def test_a_step_running_when_its_run_times_out_is_cancelled_with_the_reason(team, move_clock):
    run = _late_agent(team, move_clock, on_duration="fail")

    assert run_time_out(run_id=run.id)

    step = step_of(run, "think")
    assert (step.state, step.skip_reason) == ("cancelled", "run timed out")
    [cancelled] = events(step, "step.cancelled")
    assert (cancelled.actor, cancelled.payload) == ("service:reaper", {"class": "budget",
                                                                       "message": "run timed out"})


@pytest.mark.parametrize("hold", [True, False], ids=["held", "cancelled"])
def test_stopping_a_running_step_reports_that_it_stopped_it(team, hold):
    run = start(team, echo())
    step_claim(step_id=step_of(run).id, worker="w")
    assert step_stop(Run.objects.get(id=run.id), step_of(run), reason="late", hold=hold,
                     actor=REAPER) is True
    assert step_of(run).state == ("retrying" if hold else "cancelled")


@pytest.mark.parametrize("hold", [True, False], ids=["held", "cancelled"])
def test_a_step_that_is_not_running_is_not_stopped(team, hold):
    run = start(team, AGENT, budget={"max_cost_usd": 10})
    step = step_of(run, "think")
    before = Event.objects.filter(step=step).count()

    assert step_stop(Run.objects.get(id=run.id), step, reason="late", hold=hold, actor=REAPER) is False

    step = step_of(run, "think")
    assert (step.state, step.error, step.skip_reason) == ("queued", None, "")
    assert Event.objects.filter(step=step).count() == before
    assert Reservation.objects.get(step=step).state == "reserved"  # its dispatch still holds it


def test_a_started_step_is_recorded_queued_on_its_queue(team):
    run = start(team, echo())
    step = step_of(run)
    [queued] = events(step, "step.queued")
    assert (step.state, step.queue) == ("queued", "tools")
    assert queued.payload == {"queue": "tools"}
