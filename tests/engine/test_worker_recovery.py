"""Recovering a worker step (orchestrator/engine/services/kinds/worker.py): the reaper's
`step_lease_expired` and `step_redispatch`, and an operator's `step_requeue` (through
`operators.step_retry`, as the API and the admin call it).

What each recovery may touch, and nothing more: the lost attempt of that one step, the message
of that one queued step, and, for a requeue, the one step an operator may run again — refused,
with a message that says why, for a step that never reached a queue, a run that has ended and a
requeue its budget would not allow — its next attempt's reservation, the events that record who
brought the run back and why, and the message that sends the step to its queue.

The last tests are what a retry of a failed run does for the steps it holds cancelled: one that
was running when the run failed was cancelled for the same failure, and is reopened with the
others; one a failed loop cancelled (its iteration's next step) was not stopped by the run's
end, and stays cancelled.
"""
from datetime import timedelta
from decimal import Decimal

import pytest

from budgets.models import Reservation
from orchestrator.engine.errors import BudgetExceeded, NotAllowed
from orchestrator.engine.retry import StepError
from orchestrator.engine.services.kinds import worker
from orchestrator.engine.services.kinds.worker import (
    Usage,
    step_claim,
    step_fail,
    step_lease_expired,
    step_redispatch,
    step_succeed,
)
from orchestrator.engine.services.operators import step_retry
from orchestrator.engine.services.runs import run_cancel
from orchestrator.models import DeadLetter, Event, Run, StepAttempt, StepRun
from tests.engine import test_worker
from tests.engine.test_loops import loop
from tests.engine.test_worker import (
    AGENT,
    NO_RETRY,
    RETRY,
    echo,
    events,
    messages,
    start,
    step_of,
)

pytestmark = pytest.mark.django_db
broker = test_worker.broker  # the messages handed to Celery after commit (a fixture)


def run_of(run: Run) -> Run:
    return Run.objects.get(id=run.id)


def fail(run: Run, name: str = "work", *, cost: str = "0") -> StepRun:
    """A worker claims the queued step `name` and its attempt fails for good."""
    claim = step_claim(step_id=step_of(run, name).id, worker="w")
    assert claim is not None, f"{name} is {step_of(run, name).state}, not queued"
    step_fail(step_id=claim.step_id, attempt=claim.attempt, error=StepError("permanent", "no"),
              usage=Usage(cost_usd=Decimal(cost), model="fast"), worker="w")
    return step_of(run, name)


# --- a lease that expired --------------------------------------------------------------------


def test_an_expired_lease_is_recorded_on_the_step_as_a_lost_worker(team, move_clock, settings):
    run = start(team, echo(timeout_s=600, retry=RETRY))
    step_claim(step_id=step_of(run).id, worker="w")
    move_clock(settings.STEPWISE_LEASE_S + 1)
    assert step_lease_expired(step_id=step_of(run).id)
    step = step_of(run)
    assert step.error == {"class": "lost", "message": "worker lease expired"}
    [retrying] = events(step, "step.retrying")
    assert (retrying.payload["class"], retrying.payload["message"]) == ("lost", "worker lease expired")


def test_a_lost_attempt_that_is_not_retried_is_dead_lettered_as_a_lost_worker(
        team, operator, move_clock, settings):
    run = start(team, echo(timeout_s=600, retry=RETRY))
    step_claim(step_id=step_of(run).id, worker="w")
    run_cancel(run_id=run.id, actor=operator)  # a run being cancelled retries nothing
    move_clock(settings.STEPWISE_LEASE_S + 1)
    assert step_lease_expired(step_id=step_of(run).id)
    step = step_of(run)
    assert (step.state, step.error) == ("failed", {"class": "lost", "message": "worker lease expired",
                                                   "attempts": 1})
    letter = DeadLetter.objects.get(step=step)
    assert (letter.error_class, letter.error_message) == ("lost", "worker lease expired")


def test_an_expired_lease_closes_the_attempt_of_that_step_only(team, move_clock, settings):
    lost = start(team, echo(timeout_s=600), name="lost")
    other = start(team, echo(timeout_s=600), name="other")
    step_claim(step_id=step_of(lost).id, worker="w1")
    move_clock(settings.STEPWISE_LEASE_S - 5)
    step_claim(step_id=step_of(other).id, worker="w2")  # attempt 1 too, its lease still good
    move_clock(settings.STEPWISE_LEASE_S + 1)
    assert step_lease_expired(step_id=step_of(lost).id)
    assert StepAttempt.objects.get(step=step_of(lost)).outcome == "lost"
    untouched = StepAttempt.objects.get(step=step_of(other))
    assert (untouched.outcome, untouched.finished_at, untouched.error_message) == ("", None, "")
    assert step_of(other).state == "running"


# --- a lost message --------------------------------------------------------------------------


def test_a_step_no_longer_queued_is_not_sent_again_while_other_steps_are_queued(
        team, django_capture_on_commit_callbacks):
    claimed, waiting = start(team, echo(), name="claimed"), start(team, echo(), name="waiting")
    step_claim(step_id=step_of(claimed).id, worker="w")
    with django_capture_on_commit_callbacks() as sent:
        assert not step_redispatch(step_id=step_of(claimed).id)
    assert messages(sent, "step_dispatch_on_commit") == []
    assert step_of(waiting).state == "queued"


def test_sending_a_lost_message_again_sends_that_step_and_restamps_it_alone(team, broker,
                                                                           move_clock):
    lost, waiting = start(team, echo(), name="lost"), start(team, echo(), name="waiting")
    waiting_since = step_of(waiting).queued_at
    move_clock(30)
    with broker() as sent:
        assert step_redispatch(step_id=step_of(lost).id)
    assert [(task, args) for task, args, _ in sent] == [("execute_step", (step_of(lost).id,))]
    assert step_of(lost).queued_at == waiting_since + timedelta(seconds=30)
    assert step_of(waiting).queued_at == waiting_since  # another queued step keeps its time


def test_a_step_claimed_while_its_message_is_sent_again_keeps_its_queued_time(
        team, move_clock, monkeypatch):
    """The reaper reads the queued step, then, in its own transaction, sends it again and
    restamps it. A worker in another process may claim the step in between: the restamp must
    then leave the running step alone. The claim is made at that very point, in this process."""
    run = start(team, echo())
    queued_at = step_of(run).queued_at
    send = worker.step_dispatch_on_commit

    def send_while_a_worker_claims(step_id, queue, **named):
        step_claim(step_id=step_id, worker="w")
        send(step_id, queue, **named)

    monkeypatch.setattr(worker, "step_dispatch_on_commit", send_while_a_worker_claims)
    move_clock(30)
    assert step_redispatch(step_id=step_of(run).id)
    step = step_of(run)
    assert (step.state, step.queued_at) == ("running", queued_at)


# --- an operator's requeue: what is refused, and why -------------------------------------------


def test_a_step_that_never_reached_a_queue_cannot_be_run_again(team, operator):
    """A condition that cannot be evaluated fails its step as it is planned, before any queue:
    only a restart of the run evaluates it again."""
    run = start(team, echo("first"), echo(after=["first"], when="steps.first.output.missing == 1"),
                on_error="pause")
    step_succeed(step_id=step_claim(step_id=step_of(run, "first").id, worker="w").step_id,
                 attempt=1, output={}, usage=Usage(), worker="w")
    step = step_of(run)
    assert (step.state, step.queue, step.error["class"]) == ("failed", "", "validation")
    with pytest.raises(NotAllowed) as refused:
        step_retry(step_id=step.id, actor=operator)
    assert str(refused.value) == "a tool step cannot be run again; its run must be restarted"
    assert step_of(run).state == "failed" and run_of(run).state == "paused"


@pytest.mark.parametrize("ended", ["completed", "cancelled"])
def test_a_failed_step_of_a_run_that_ended_otherwise_cannot_be_run_again(team, operator, ended):
    if ended == "completed":  # under `continue`, a failed step does not stop its run
        run = start(team, echo(retry=NO_RETRY), on_error="continue")
        fail(run)
    else:
        run = start(team, echo(retry=NO_RETRY), on_error="pause")
        fail(run)
        run_cancel(run_id=run.id, actor=operator)
    assert run_of(run).state == ended
    with pytest.raises(NotAllowed) as refused:
        step_retry(step_id=step_of(run).id, actor=operator)
    assert str(refused.value) == f"run {run.id} is {ended}; its steps cannot be redriven"
    assert step_of(run).state == "failed"


def model_step(**extra) -> dict:
    return {**{key: value for key, value in AGENT.items() if key != "script"}, "name": "work",
            "retry": NO_RETRY, **extra}


def test_a_requeue_the_run_budget_cannot_pay_for_is_refused_with_the_denial(team, operator,
                                                                            settings):
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"
    run = start(team, model_step(), on_error="pause", budget={"max_cost_usd": 0.5})
    step = fail(run, cost="0.45")
    assert run_of(run).state == "paused"
    before = Event.objects.filter(run=run).count()

    with pytest.raises(BudgetExceeded) as refused:
        step_retry(step_id=step.id, actor=operator)

    message = ("run budget: $0.4500 committed + $0.1000 projected for step 'work' would exceed "
               "the limit of $0.50")
    assert str(refused.value) == message
    assert refused.value.detail == {"class": "budget", "level": "run", "step": "work",
                                    "limit_usd": "0.500000", "committed_usd": "0.450000",
                                    "projected_usd": "0.100000", "message": message}
    assert (step_of(run).state, run_of(run).state) == ("failed", "paused")
    assert Event.objects.filter(run=run).count() == before
    assert not Reservation.objects.filter(step=step, attempt=2).exists()


# --- an operator's requeue: what it does --------------------------------------------------------


def test_a_requeued_model_step_reserves_its_next_attempt_which_its_success_settles(
        team, operator, settings):
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"
    run = start(team, model_step(), on_error="pause", budget={"max_cost_usd": 5})
    step = fail(run, cost="0.05")

    step_retry(step_id=step.id, actor=operator)

    reserved = Reservation.objects.filter(step=step).order_by("attempt")
    assert list(reserved.values_list("attempt", "state")) == [(1, "settled"), (2, "reserved")]
    claim = step_claim(step_id=step.id, worker="w")
    assert claim.attempt == 2
    step_succeed(step_id=step.id, attempt=2, output={"ok": True},
                 usage=Usage(cost_usd=Decimal("0.02"), model="fast"), worker="w")
    assert list(reserved.values_list("attempt", "state", "actual")) == [
        (1, "settled", Decimal("0.05")), (2, "settled", Decimal("0.02"))]


@pytest.mark.parametrize("on_error, stopped", [("pause", "paused"), ("fail", "failed")])
def test_a_requeue_records_who_brought_the_run_back_and_why(team, operator, on_error, stopped):
    run = start(team, echo(retry=NO_RETRY), on_error=on_error)
    step = fail(run)
    assert run_of(run).state == stopped
    before = Event.objects.filter(run=run).latest("id").id

    step_retry(step_id=step.id, actor=operator)

    [back] = Event.objects.filter(run=run, kind="run.running", id__gt=before)
    assert (back.step, back.actor, back.payload) == (None, "user:operator",
                                                     {"reason": "operator retry"})
    [queued] = events(step, "step.queued")[1:]  # after the first dispatch's
    assert (queued.actor, queued.payload) == ("user:operator", {"reason": "operator retry"})


def test_a_requeued_step_is_sent_to_its_queue_named_by_its_run_and_step(team, operator, broker):
    run = start(team, echo(retry=NO_RETRY), on_error="pause")
    step = fail(run)
    with broker() as sent:
        step_retry(step_id=step.id, actor=operator)
    [(task, args, options)] = [message for message in sent if message[0] == "execute_step"]
    assert (args, options["queue"]) == ((step.id,), "tools")
    headers = options["headers"]
    assert (headers["stepwise_run"], headers["stepwise_step"]) == (str(run.id), "work")


def test_retrying_a_failed_run_reopens_a_step_its_failure_stopped_mid_attempt(team, operator):
    run = start(team, echo("first", retry=NO_RETRY), echo("call", side_effect=True, retry=NO_RETRY),
                echo("after", after=["first", "call"]), on_error="fail")
    call = step_claim(step_id=step_of(run, "call").id, worker="w")
    fail(run, "first")  # the run fails while `call` is running
    worker._execute_claimed(call.step_id, call, "w")  # the ledger refuses its effect now
    assert step_of(run, "call").state == "cancelled"
    assert run_of(run).state == "failed"

    step_retry(step_id=step_of(run, "first").id, actor=operator)

    assert step_of(run, "call").state == "blocked"
    for name in ("first", "call", "after"):
        claim = step_claim(step_id=step_of(run, name).id, worker="w")
        step_succeed(step_id=claim.step_id, attempt=claim.attempt, output={}, usage=Usage(),
                     worker="w")
    assert run_of(run).state == "completed"


def test_retrying_a_failed_run_leaves_the_steps_a_failed_loop_cancelled_cancelled(team, operator):
    run = start(team, loop(), echo("publish", after=["refine"]), echo("other", retry=NO_RETRY),
                input={"topic": "tides"}, on_error="fail")
    other = step_claim(step_id=step_of(run, "other").id, worker="w")
    fail(run, "draft[1]")  # the loop fails, and its release cancels the rest of its iteration
    step_fail(step_id=other.step_id, attempt=other.attempt, error=StepError("permanent", "down"),
              usage=Usage(), worker="w")  # `other` was running as the run failed
    assert run_of(run).state == "failed"
    stopped = {name: (step_of(run, name).state, step_of(run, name).skip_reason)
               for name in ("critique[1]", "publish")}
    assert stopped == {"critique[1]": ("cancelled", "loop step 'refine' ended failed"),
                       "publish": ("cancelled", "run failed")}

    step_retry(step_id=step_of(run, "other").id, actor=operator)

    assert run_of(run).state == "running"
    assert step_of(run, "other").state == "queued"
    assert step_of(run, "publish").state == "blocked"  # stopped by the run's end: reopened
    critique = step_of(run, "critique[1]")
    assert (critique.state, critique.skip_reason) == ("cancelled", "loop step 'refine' ended failed")
    assert events(critique, "step.blocked") == []
    assert (step_of(run, "refine").state, step_of(run, "draft[1]").state) == ("failed", "failed")
