"""A worker step's life, service by service (orchestrator/engine/services/kinds/worker.py): claimed
under a lease, executed, succeeded or failed, retried, recovered by the reaper, re-sent.

Each service is called directly, as a worker, the reaper or an operator calls it, and its
writes are read back: the claim and its attempt record, what a stale attempt may not write, the
usage charged, the retry and its message, the lease. Runs are driven in this process; the test
transaction never commits, so no message is consumed (messages are taken at `on_commit`).
"""
from datetime import timedelta
from decimal import Decimal

import pytest

from orchestrator.engine import limits
from orchestrator.engine.attestation import attestation_digest
from orchestrator.engine.clock import now
from orchestrator.engine.leases import lease_until
from orchestrator.engine.retry import StepError
from orchestrator.engine.services.kinds.worker import (
    Usage,
    claim_holds,
    lease_extend,
    step_claim,
    step_execute,
    step_fail,
    step_lease_expired,
    step_redispatch,
    step_refuse,
    step_retry_due,
    step_spec,
    step_succeed,
)
from orchestrator.engine.services.runs import run_cancel, run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import DeadLetter, Event, Run, StepAttempt, StepRun
from orchestrator.operations import metrics
from tests.factories import SETUP

pytestmark = pytest.mark.django_db

NO_RETRY = {"max_attempts": 1}
RETRY = {"max_attempts": 3, "base_s": 1, "max_s": 1, "jitter": False, "backoff": "fixed"}


def start(team, *steps, input=None, **definition) -> Run:
    version, _ = workflow_save(team=team, definition={
        "name": definition.pop("name", "worked"), "input_schema": {"type": "object"},
        "steps": list(steps), **definition}, actor=SETUP)
    return run_start(version=version, input=input or {}, actor=SETUP)


def echo(name="work", **extra) -> dict:
    return {"name": name, "type": "tool", "tool": "core.echo", **extra}


def step_of(run: Run, name: str = "work") -> StepRun:
    return StepRun.objects.get(run=run, name=name)


def events(step: StepRun, kind: str) -> list[Event]:
    return list(Event.objects.filter(step=step, kind=kind).order_by("id"))


def messages(sent, task: str) -> list:
    """The on-commit callbacks that send `task` (dispatch.py's *_on_commit)."""
    return [callback for callback in sent if task in callback.__qualname__]


def sample(metric, suffix: str, labels: dict) -> float:
    """A Prometheus sample of `metric` with these labels. The child is made first: in
    multiprocess mode it starts from what a dead process of this pid left in its file (pids
    are reused), so a count read before it exists would miss that."""
    metric.labels(**labels)
    for family in metric.collect():
        for found in family.samples:
            if found.name.endswith(suffix) and found.labels == labels:
                return found.value
    return 0.0


# --- claiming --------------------------------------------------------------------------------


def test_a_claim_names_the_attempt_and_everything_the_worker_needs(team):
    run = start(team, echo(params={"a": 1}, timeout_s=40))
    step = step_of(run)
    claim = step_claim(step_id=step.id, worker="w1")

    step.refresh_from_db()
    assert (claim.step_id, claim.attempt, claim.run_id) == (step.id, 1, run.id)
    assert (claim.workflow, claim.team, claim.queue) == ("worked", "support", step.queue)
    assert claim.spec["name"] == "work" and claim.spec["timeout_s"] == 40
    assert claim.step_input == step.input == {"input": {}, "steps": {}}
    assert claim.params_override == {}
    assert claim.idempotency_key == f"{run.id}:work:default"
    assert (step.state, step.attempts, step.lease_owner) == ("running", 1, "w1")
    assert (step.deadline_at - step.started_at) == timedelta(seconds=40)
    attempt = StepAttempt.objects.get(step=step)
    assert (attempt.number, attempt.worker, attempt.idempotency_key) == (1, "w1", claim.idempotency_key)
    assert attempt.started_at == step.started_at and attempt.finished_at is None
    [running] = events(step, "step.running")
    assert (running.actor, running.payload) == ("worker:w1", {"attempt": 1})


def test_a_claim_observes_the_scheduling_latency_of_its_queue(team):
    run = start(team, echo())
    queue = step_of(run).queue
    before = sample(metrics.SCHEDULING_LATENCY, "_count", {"queue": queue})
    step_claim(step_id=step_of(run).id, worker="w")
    assert sample(metrics.SCHEDULING_LATENCY, "_count", {"queue": queue}) == before + 1


def test_a_second_delivery_of_a_claimed_step_claims_nothing(team):
    run = start(team, echo())
    assert step_claim(step_id=step_of(run).id, worker="w1") is not None
    assert step_claim(step_id=step_of(run).id, worker="w2") is None
    assert StepAttempt.objects.filter(step=step_of(run)).count() == 1
    assert step_of(run).lease_owner == "w1"


def test_a_step_of_a_run_that_is_not_advancing_is_not_claimed(team):
    run = start(team, echo())
    Run.objects.filter(id=run.id).update(state="paused")
    assert step_claim(step_id=step_of(run).id, worker="w") is None
    assert step_of(run).state == "queued"


def test_a_message_for_a_step_that_no_longer_exists_claims_nothing(team):
    assert step_claim(step_id=987654, worker="w") is None


def test_the_retry_of_a_step_is_claimed_as_its_next_attempt(team):
    run = start(team, echo(retry=RETRY))
    claim = step_claim(step_id=step_of(run).id, worker="w")
    step_fail(step_id=claim.step_id, attempt=1, error=StepError("transient", "503"), usage=Usage(),
              worker="w")
    StepRun.objects.filter(id=claim.step_id).update(next_attempt_at=now())
    assert step_retry_due(step_id=claim.step_id)
    again = step_claim(step_id=claim.step_id, worker="w2")
    assert again.attempt == 2 and again.idempotency_key == claim.idempotency_key
    assert list(StepAttempt.objects.filter(step_id=claim.step_id).values_list("number", "worker")
                .order_by("number")) == [(1, "w"), (2, "w2")]


def test_refusing_a_step_that_is_no_longer_queued_changes_nothing(team):
    run = start(team, echo())
    step_claim(step_id=step_of(run).id, worker="w")
    assert not step_refuse(step_id=step_of(run).id, error=StepError("policy", "no"), worker="w")
    assert step_of(run).state == "running"


def test_a_refused_step_fails_dead_lettered_under_the_worker_name(team):
    run = start(team, echo(retry=NO_RETRY))
    assert step_refuse(step_id=step_of(run).id, error=StepError("policy", "approval withdrawn"),
                       worker="w")
    step = step_of(run)
    assert (step.state, step.error["class"], step.error["message"]) == ("failed", "policy",
                                                                       "approval withdrawn")
    assert events(step, "step.failed")[0].actor == "worker:w"
    assert DeadLetter.objects.get(step=step).error_class == "policy"


def test_the_spec_of_a_step_is_its_definition(team):
    run = start(team, echo(params={"x": 1}))
    spec = step_spec(step_id=step_of(run).id)
    assert (spec["name"], spec["tool"], spec["params"]) == ("work", "core.echo", {"x": 1})


# --- fencing and the lease ----------------------------------------------------------------------


def test_only_the_current_attempt_of_a_running_step_holds_its_claim(team):
    run = start(team, echo())
    step = step_of(run)
    assert not claim_holds(step_id=step.id, attempt=0)  # queued: nobody holds it
    step_claim(step_id=step.id, worker="w")
    assert claim_holds(step_id=step.id, attempt=1)
    assert not claim_holds(step_id=step.id, attempt=2)
    assert not claim_holds(step_id=987654, attempt=1)


def test_a_heartbeat_pushes_the_lease_of_its_own_attempt_only(team, move_clock):
    run = start(team, echo())
    step = step_of(run)
    step_claim(step_id=step.id, worker="w")
    move_clock(20)
    assert not lease_extend(step_id=step.id, attempt=2)
    assert step_of(run).lease_expires_at < lease_until()
    assert lease_extend(step_id=step.id, attempt=1)
    assert step_of(run).lease_expires_at == lease_until()


def test_a_heartbeat_for_a_step_no_longer_running_is_refused(team):
    run = start(team, echo())
    step = step_of(run)
    step_claim(step_id=step.id, worker="w")
    step_succeed(step_id=step.id, attempt=1, output={}, usage=Usage(), worker="w")
    assert not lease_extend(step_id=step.id, attempt=1)
    assert step_of(run).lease_expires_at is None


def test_a_lease_not_yet_expired_is_left_alone(team, move_clock, settings):
    run = start(team, echo(timeout_s=600))
    step_claim(step_id=step_of(run).id, worker="w")
    move_clock(settings.STEPWISE_LEASE_S - 1)
    assert not step_lease_expired(step_id=step_of(run).id)
    assert step_of(run).state == "running"


def test_an_expired_lease_loses_the_attempt_and_retries_it(team, move_clock, settings):
    run = start(team, echo(timeout_s=600))
    step_claim(step_id=step_of(run).id, worker="w")
    move_clock(settings.STEPWISE_LEASE_S + 1)
    assert step_lease_expired(step_id=step_of(run).id)
    step = step_of(run)
    assert (step.state, step.error["class"]) == ("retrying", "lost")
    attempt = StepAttempt.objects.get(step=step)
    assert (attempt.outcome, attempt.error_class, attempt.error_message) == (
        "lost", "lost", "lease held by w expired")
    assert attempt.finished_at == now()
    [retrying] = events(step, "step.retrying")
    assert retrying.actor == "service:reaper"
    assert not step_lease_expired(step_id=step.id)  # not running any more


def test_a_queued_step_without_a_lease_is_not_expired(team):
    run = start(team, echo())
    assert not step_lease_expired(step_id=step_of(run).id)


# --- finishing an attempt -------------------------------------------------------------------


def test_a_success_stores_the_output_charges_the_usage_and_closes_the_attempt(team):
    run = start(team, echo(), echo("next", after=["work"]))
    step = step_of(run)
    step_claim(step_id=step.id, worker="w")
    usage = Usage(tokens_in=10, tokens_out=5, cost_usd=Decimal("0.25"), model="m1", provider="p1",
                  meta={"prompt_hash": "abc", "not_a_field": "dropped"})

    assert step_succeed(step_id=step.id, attempt=1, output={"ok": True}, usage=usage, worker="w")

    step, run = step_of(run), Run.objects.get(id=run.id)
    assert (step.state, step.output) == ("completed", {"ok": True})
    assert (step.tokens_in, step.tokens_out, step.cost_usd) == (10, 5, Decimal("0.25"))
    assert (run.tokens_in, run.tokens_out, run.cost_usd) == (10, 5, Decimal("0.25"))
    attempt = StepAttempt.objects.get(step=step)
    assert (attempt.outcome, attempt.tokens_in, attempt.tokens_out, attempt.cost_usd) == (
        "succeeded", 10, 5, Decimal("0.25"))
    assert (attempt.model, attempt.provider, attempt.prompt_hash) == ("m1", "p1", "abc")
    assert (attempt.error_class, attempt.error_message) == ("", "")
    assert attempt.finished_at is not None
    [completed] = events(step, "step.completed")
    assert completed.actor == "worker:w"
    assert completed.payload == {"attempt": 1, "tokens_in": 10, "tokens_out": 5, "cost_usd": "0.25",
                                 "attestation": attestation_digest(step.attestation)}
    assert attempt.attestation == step.attestation  # signed by this process, beside the attempt
    assert step_of(run, "next").state == "queued"  # the run moved on in the same transaction


def test_usage_adds_to_what_the_step_and_the_run_spent_before(team):
    run = start(team, echo(retry=RETRY))
    step = step_of(run)
    step_claim(step_id=step.id, worker="w")
    spent = Usage(tokens_in=3, tokens_out=2, cost_usd=Decimal("0.5"), model="m")
    step_fail(step_id=step.id, attempt=1, error=StepError("transient", "503"), usage=spent, worker="w")
    StepRun.objects.filter(id=step.id).update(next_attempt_at=now())
    step_retry_due(step_id=step.id)
    step_claim(step_id=step.id, worker="w")
    step_succeed(step_id=step.id, attempt=2, output={}, usage=Usage(tokens_in=1, tokens_out=1,
                 cost_usd=Decimal("0.25"), model="m"), worker="w")
    step, run = step_of(run), Run.objects.get(id=run.id)
    assert (step.tokens_in, step.tokens_out, step.cost_usd) == (4, 3, Decimal("0.75"))
    assert (run.tokens_in, run.tokens_out, run.cost_usd) == (4, 3, Decimal("0.75"))
    assert list(StepAttempt.objects.filter(step=step).order_by("number").values_list(
        "outcome", "cost_usd")) == [("failed", Decimal("0.5")), ("succeeded", Decimal("0.25"))]


@pytest.mark.parametrize("usage", [Usage(tokens_in=1), Usage(tokens_out=1),
                                   Usage(cost_usd=Decimal("0.01"))])
def test_any_part_of_a_usage_is_charged(team, usage):
    run = start(team, echo())
    step_claim(step_id=step_of(run).id, worker="w")
    step_succeed(step_id=step_of(run).id, attempt=1, output={}, usage=usage, worker="w")
    run = Run.objects.get(id=run.id)
    assert (run.tokens_in, run.tokens_out, run.cost_usd) == (usage.tokens_in, usage.tokens_out,
                                                             usage.cost_usd)


def test_a_stale_success_is_recorded_on_its_attempt_and_changes_nothing_else(team, move_clock,
                                                                              settings):
    run = start(team, echo(timeout_s=600))
    step = step_of(run)
    step_claim(step_id=step.id, worker="w1")
    move_clock(settings.STEPWISE_LEASE_S + 1)
    step_lease_expired(step_id=step.id)  # attempt 1 is lost; its retry is attempt 2
    usage = Usage(tokens_in=7, cost_usd=Decimal("0.1"))
    assert not step_succeed(step_id=step.id, attempt=1, output={"late": True}, usage=usage, worker="w1")
    step, run = step_of(run), Run.objects.get(id=run.id)
    assert (step.state, step.output, step.tokens_in) == ("retrying", None, 0)
    assert (run.tokens_in, run.cost_usd) == (0, Decimal("0"))
    attempt = StepAttempt.objects.get(step=step, number=1)
    assert (attempt.outcome, attempt.tokens_in, attempt.cost_usd) == ("stale", 7, Decimal("0.1"))
    assert not events(step, "step.completed")


def test_a_stale_failure_is_recorded_on_its_attempt_and_changes_nothing_else(team):
    run = start(team, echo())
    step = step_of(run)
    step_claim(step_id=step.id, worker="w")
    step_succeed(step_id=step.id, attempt=1, output={"ok": 1}, usage=Usage(), worker="w")
    assert not step_fail(step_id=step.id, attempt=1, error=StepError("permanent", "late"),
                         usage=Usage(tokens_in=2), worker="w")
    assert step_of(run).state == "completed"
    attempt = StepAttempt.objects.get(step=step)
    assert (attempt.outcome, attempt.error_class, attempt.error_message) == ("stale", "permanent", "late")
    assert Run.objects.get(id=run.id).tokens_in == 0


def test_a_failure_the_policy_retries_is_scheduled_and_its_message_sent_after_commit(
        team, move_clock, django_capture_on_commit_callbacks):
    run = start(team, echo(retry=RETRY))
    step = step_of(run)
    step_claim(step_id=step.id, worker="w")
    with django_capture_on_commit_callbacks() as sent:
        assert step_fail(step_id=step.id, attempt=1, error=StepError("transient", "HTTP 503"),
                         usage=Usage(tokens_in=4), worker="w")
    step = step_of(run)
    assert (step.state, step.error) == ("retrying", {"class": "transient", "message": "HTTP 503"})
    assert step.next_attempt_at == now() + timedelta(seconds=1)  # the fixed 1 s of the policy
    attempt = StepAttempt.objects.get(step=step)
    assert (attempt.outcome, attempt.error_class, attempt.error_message, attempt.tokens_in) == (
        "failed", "transient", "HTTP 503", 4)
    [retrying] = events(step, "step.retrying")
    assert retrying.actor == "worker:w"
    assert retrying.payload == {"class": "transient", "message": "HTTP 503", "attempt": 1,
                                "at": step.next_attempt_at.isoformat()}
    assert len(messages(sent, "retry_due_on_commit")) == 1  # the delayed retry message
    assert not DeadLetter.objects.filter(step=step).exists()


def test_a_retry_too_far_ahead_for_the_broker_sends_no_message(team, django_capture_on_commit_callbacks):
    """The broker holds short delays only; a longer one is found due by the reaper instead."""
    run = start(team, echo(retry={**RETRY, "base_s": 3600, "max_s": 3600}))
    step = step_of(run)
    step_claim(step_id=step.id, worker="w")
    with django_capture_on_commit_callbacks() as sent:
        step_fail(step_id=step.id, attempt=1, error=StepError("transient", "503"), usage=Usage(),
                  worker="w")
    assert step_of(run).state == "retrying" and messages(sent, "retry_due_on_commit") == []


def test_a_failure_past_its_policy_fails_the_step_dead_lettered(team):
    run = start(team, echo(retry=NO_RETRY))
    step = step_of(run)
    step_claim(step_id=step.id, worker="w")
    assert step_fail(step_id=step.id, attempt=1, error=StepError("permanent", "no"), usage=Usage(),
                     worker="w")
    step = step_of(run)
    assert (step.state, step.error) == ("failed", {"class": "permanent", "message": "no", "attempts": 1})
    [failed] = events(step, "step.failed")
    assert (failed.actor, failed.payload) == ("worker:w", step.error)
    letter = DeadLetter.objects.get(step=step)
    assert letter.error_class == "permanent"
    assert Run.objects.get(id=run.id).state == "failed"


def test_a_timeout_with_no_retry_left_times_the_step_out(team):
    run = start(team, echo(retry=NO_RETRY))
    step = step_of(run)
    step_claim(step_id=step.id, worker="w")
    step_fail(step_id=step.id, attempt=1, error=StepError("timeout", "too slow"), usage=Usage(),
              worker="w")
    step = step_of(run)
    assert (step.state, step.error) == ("timed_out", {"class": "timeout", "message": "too slow"})
    assert events(step, "step.timed_out")[0].payload == step.error
    assert DeadLetter.objects.get(step=step).error_class == "timeout"


def test_an_attempt_stopped_by_a_cancel_cancels_the_step_without_a_dead_letter(team):
    run = start(team, echo(retry=RETRY))
    step = step_of(run)
    step_claim(step_id=step.id, worker="w")
    step_fail(step_id=step.id, attempt=1, error=StepError("cancelled", "run is cancelling"),
              usage=Usage(), worker="w")
    step = step_of(run)
    assert (step.state, step.skip_reason) == ("cancelled", "run is cancelling")
    [cancelled] = events(step, "step.cancelled")
    assert (cancelled.actor, cancelled.payload) == ("worker:w", {"class": "cancelled",
                                                                 "message": "run is cancelling"})
    assert not DeadLetter.objects.filter(step=step).exists()


def test_a_failure_of_a_run_being_cancelled_is_not_retried(team):
    run = start(team, echo(retry=RETRY))
    step = step_of(run)
    step_claim(step_id=step.id, worker="w")
    run_cancel(run_id=run.id, actor=SETUP)
    step_fail(step_id=step.id, attempt=1, error=StepError("transient", "503"), usage=Usage(),
              worker="w")
    step = step_of(run)
    assert (step.state, step.error["class"]) == ("failed", "transient")
    assert not events(step, "step.retrying")


# --- a retry coming due ------------------------------------------------------------------------


def _retrying(team, **spec) -> StepRun:
    run = start(team, echo(retry=RETRY, **spec))
    step = step_of(run)
    step_claim(step_id=step.id, worker="w")
    step_fail(step_id=step.id, attempt=1, error=StepError("transient", "503"), usage=Usage(),
              worker="w")
    return step_of(run)


def test_a_retry_is_queued_when_due_and_not_before(team, move_clock, django_capture_on_commit_callbacks):
    step = _retrying(team)
    assert not step_retry_due(step_id=step.id)  # due one second later
    move_clock(1)
    with django_capture_on_commit_callbacks() as sent:
        assert step_retry_due(step_id=step.id)
    step.refresh_from_db()
    assert step.state == "queued" and step.next_attempt_at is None
    assert events(step, "step.queued")[-1].payload == {"retry": True}
    assert len(messages(sent, "step_dispatch_on_commit")) == 1
    assert not step_retry_due(step_id=step.id)  # queued now, not retrying


def test_a_retry_of_a_run_that_is_not_advancing_waits(team, move_clock):
    step = _retrying(team)
    move_clock(5)
    Run.objects.filter(id=step.run_id).update(state="paused")
    assert not step_retry_due(step_id=step.id)
    assert step_of(step.run).state == "retrying"


def test_a_retry_over_the_run_budget_pauses_the_run_and_stays_retrying(team, move_clock, settings):
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"
    run = start(team, {"name": "work", "type": "agent", "model": "fast", "prompt": "hi",
                       "output_schema": {"type": "object"}, "retry": RETRY},
                budget={"max_cost_usd": 0.5})
    step = step_of(run)
    step_claim(step_id=step.id, worker="w")
    step_fail(step_id=step.id, attempt=1, error=StepError("transient", "503"),
              usage=Usage(cost_usd=Decimal("0.45"), model="fast"), worker="w")
    move_clock(5)
    assert not step_retry_due(step_id=step.id)  # 0.45 spent + 0.10 estimated > 0.5
    assert step_of(run).state == "retrying"
    run = Run.objects.get(id=run.id)
    assert (run.state, run.error["class"]) == ("paused", "budget")


# --- a lost message ---------------------------------------------------------------------------


def test_a_lost_message_of_a_queued_step_is_sent_again(team, move_clock, django_capture_on_commit_callbacks):
    run = start(team, echo())
    queued_at = step_of(run).queued_at
    move_clock(30)
    with django_capture_on_commit_callbacks() as sent:
        assert step_redispatch(step_id=step_of(run).id)
    assert len(messages(sent, "step_dispatch_on_commit")) == 1
    assert step_of(run).queued_at == queued_at + timedelta(seconds=30)


def test_a_step_no_longer_queued_is_not_sent_again(team, django_capture_on_commit_callbacks):
    run = start(team, echo())
    step_claim(step_id=step_of(run).id, worker="w")
    with django_capture_on_commit_callbacks() as sent:
        assert not step_redispatch(step_id=step_of(run).id)
    assert messages(sent, "step_dispatch_on_commit") == []


# --- executing in this process ---------------------------------------------------------------


def test_executing_a_step_runs_its_tool_and_commits_its_output(team):
    run = start(team, echo(params={"said": "{{ input.word }}"}), input={"word": "hello"})
    step = step_of(run)
    before = sample(metrics.STEP_DURATION, "_count", {"kind": "tool", "queue": step.queue,
                                                      "outcome": "succeeded"})
    assert step_execute(step_id=step.id, worker="w") == 0
    step = step_of(run)
    assert (step.state, step.output) == ("completed", {"said": "hello"})
    assert StepAttempt.objects.get(step=step).outcome == "succeeded"
    assert sample(metrics.STEP_DURATION, "_count", {"kind": "tool", "queue": step.queue,
                                                    "outcome": "succeeded"}) == before + 1


def test_executing_a_step_already_claimed_does_nothing(team):
    run = start(team, echo())
    step_claim(step_id=step_of(run).id, worker="other")
    assert step_execute(step_id=step_of(run).id, worker="w") == 0
    assert step_of(run).state == "running" and StepAttempt.objects.count() == 1


def test_a_failing_call_fails_the_attempt_with_its_error(team):
    run = start(team, {"name": "work", "type": "tool", "tool": "http.request", "retry": NO_RETRY,
                       "params": {"method": "GET", "url": "http://127.0.0.1:9/nothing"}})
    step = step_of(run)
    before = sample(metrics.STEP_DURATION, "_count", {"kind": "tool", "queue": step.queue,
                                                      "outcome": "failed"})
    step_execute(step_id=step.id, worker="w")
    step = step_of(run)
    attempt = StepAttempt.objects.get(step=step)
    assert step.state == "failed" and attempt.outcome == "failed" and attempt.error_class
    assert sample(metrics.STEP_DURATION, "_count", {"kind": "tool", "queue": step.queue,
                                                    "outcome": "failed"}) == before + 1


def test_a_step_over_its_dependency_rate_limit_stays_queued_and_says_how_long_to_wait(
        team, settings, move_clock):
    settings.STEPWISE_RATE_LIMITS = {"tool:core.echo": 1}
    move_clock(0.25)  # the engine's clock, a quarter into a second that is not shared
    first, second = start(team, echo(), name="one"), start(team, echo(), name="two")
    assert step_execute(step_id=step_of(first).id, worker="w") == 0
    wait = step_execute(step_id=step_of(second).id, worker="w")
    assert 0 < wait <= 1
    assert step_of(second).state == "queued"


def test_a_step_whose_dependency_breaker_is_open_is_not_called_and_retries(team, settings):
    from django.core.cache import cache

    dependency = "tool:core.echo"
    cache.set(f"cb:{dependency}:until", limits._seconds() + 60, timeout=120)
    try:
        run = start(team, echo(retry=RETRY))
        step_execute(step_id=step_of(run).id, worker="w")
        step = step_of(run)
        attempt = StepAttempt.objects.get(step=step)
        assert (attempt.error_class, attempt.error_message) == ("transient",
                                                                f"circuit open for {dependency}")
        assert step.state == "retrying" and step.output is None
    finally:
        cache.delete_many([f"cb:{dependency}:until", f"cb:{dependency}:probe",
                           f"cb:{dependency}:failures"])


def test_a_secret_input_is_scrubbed_from_the_stored_output_and_error(team):
    secret_schema = {"type": "object", "required": ["code"], "properties": {"code": {"type": "string", "writeOnly": True}}}
    version, _ = workflow_save(team=team, definition={
        "name": "secretive", "input_schema": secret_schema, "steps": [
            echo(params={"code": "{{ input.code }}"}, side_effect=True),
            {"name": "call", "type": "tool", "tool": "http.request", "retry": NO_RETRY,
             "params": {"method": "GET", "url": "http://127.0.0.1:9/{{ input.code }}"}}]},
        actor=SETUP)
    run = run_start(version=version, input={"code": "s3cr3t-code-991"}, actor=SETUP)
    for name in ("work", "call"):
        step_execute(step_id=step_of(run, name).id, worker="w")
    from audit.models import AuditEntry
    from orchestrator.models import Effect

    stored = str(list(StepRun.objects.filter(run=run).values_list("output", "error"))) + str(
        list(StepAttempt.objects.filter(step__run=run).values_list("error_message", flat=True)))
    stored += str(list(Effect.objects.filter(run=run).values_list("result", "error")))
    stored += str(list(AuditEntry.objects.filter(run_id=str(run.id)).values_list("payload", flat=True)))
    assert Effect.objects.filter(run=run).count() == 1
    assert "s3cr3t-code-991" not in stored
    assert step_of(run).state == "completed" and step_of(run, "call").state == "failed"


# --- what the executor is handed -------------------------------------------------------------

PROBE = "test.worker_probe"


@pytest.fixture
def probe():
    """A side-effecting tool that records what each call was handed: its params, its context
    and the log ids bound around it. Registered for one test, then removed from the registry."""
    from orchestrator.integrations.tools import registry
    from orchestrator.operations import logcontext

    calls: list[dict] = []

    @registry.tool(PROBE, params_schema={"type": "object"}, side_effect=True)
    def worker_probe(params, ctx):
        calls.append({"params": params, "ctx": ctx, "log": dict(logcontext.current())})
        return {"done": len(calls)}

    yield calls
    registry._TOOLS.pop(PROBE, None)


def probed(name="work", **extra) -> dict:
    return {"name": name, "type": "tool", "tool": PROBE, **extra}


def test_a_side_effect_runs_through_the_ledger_under_its_attempt_token(team, probe):
    from audit.models import AuditEntry
    from orchestrator.models import Effect

    run = start(team, probed(params={"amount": 3}))
    step = step_of(run)
    step_execute(step_id=step.id, worker="w")

    [call] = probe
    key = f"{run.id}:work:default"
    ctx = call["ctx"]
    assert call["params"] == {"amount": 3}
    assert (ctx.run_id, ctx.step_name, ctx.attempt, ctx.idempotency_key, ctx.fencing_token) == (
        str(run.id), "work", 1, key, 1)
    assert {k: call["log"].get(k) for k in ("run_id", "step", "attempt", "workflow", "team")} == {
        "run_id": str(run.id), "step": "work", "attempt": "1", "workflow": "worked", "team": "support"}
    effect = Effect.objects.get(run=run)
    assert (effect.key, effect.step_id, effect.fence, effect.status, effect.result) == (
        key, step.id, 1, "succeeded", {"done": 1})
    authorized = AuditEntry.objects.get(action="external_call.authorized", run_id=str(run.id))
    assert (authorized.step_name, authorized.idempotency_key) == ("work", key)
    assert authorized.data["attempt"] == 1
    assert step_of(run).output == {"done": 1}


def test_an_attempt_superseded_before_its_effect_starts_calls_nothing(team, probe, move_clock,
                                                                      settings):
    """Attempt 1 claimed the step, then stalled before its call; its lease expired and attempt 2
    claimed the step. Attempt 1 resuming must not call the remote: the ledger asks its claim."""
    from orchestrator.engine.services.kinds.worker import _execute_claimed
    from orchestrator.models import Effect

    run = start(team, probed(timeout_s=600, retry=RETRY))
    step = step_of(run)
    first = step_claim(step_id=step.id, worker="w1")
    move_clock(settings.STEPWISE_LEASE_S + 1)
    step_lease_expired(step_id=step.id)
    move_clock(settings.STEPWISE_LEASE_S + 5)
    step_retry_due(step_id=step.id)
    second = step_claim(step_id=step.id, worker="w2")

    _execute_claimed(step.id, first, "w1")
    assert probe == [] and not Effect.objects.filter(run=run).exists()
    assert StepAttempt.objects.get(step=step, number=1).outcome in ("lost", "stale")
    assert step_of(run).state == "running"

    _execute_claimed(step.id, second, "w2")
    assert [call["ctx"].fencing_token for call in probe] == [2]
    assert Effect.objects.get(run=run).fence == 2
    assert step_of(run).state == "completed"


def test_parameters_changed_at_the_approval_gate_replace_the_rendered_ones(team, probe):
    from dataclasses import replace

    from orchestrator.engine.services.kinds.worker import _execute_claimed

    run = start(team, probed(params={"amount": 3, "to": "ann"}))
    step = step_of(run)
    claim = step_claim(step_id=step.id, worker="w")
    _execute_claimed(step.id, replace(claim, params_override={"amount": 2}), "w")
    assert [call["params"] for call in probe] == [{"amount": 2, "to": "ann"}]


AGENT = {"name": "think", "type": "agent", "model": "fast", "prompt": "hi",
         "output_schema": {"type": "object"},
         "script": [{"output": {"ok": True}, "tokens_in": 1000, "tokens_out": 200}]}
ROUTER = {"name": "route", "type": "router", "routes": [
    {"name": "yes", "when": "input.x > 1", "then": ["after"]}], "default": {"name": "no", "then": []}}


@pytest.fixture
def spans(settings):
    """Tracing on, spans kept in memory (the SDK's provider is installed once per process)."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from orchestrator.operations import tracing

    exporter = InMemorySpanExporter()
    tracing.configure(exporter=exporter)
    settings.STEPWISE_TRACING = True
    return exporter


def test_the_worker_traces_the_step_and_its_call(team, probe, spans):
    run = start(team, probed())
    step_execute(step_id=step_of(run).id, worker="w")
    by_name = {span.name: span for span in spans.get_finished_spans()}
    executed, called = by_name["step.execute"], by_name["tool.call"]
    assert dict(executed.attributes) == {"stepwise.run": str(run.id), "stepwise.step": "work",
                                         "stepwise.attempt": "1", "stepwise.workflow": "worked"}
    assert dict(called.attributes) == {"stepwise.target": PROBE}
    assert called.parent.span_id == executed.context.span_id


def test_a_call_span_names_the_model_of_an_agent_and_the_kind_of_a_router(team, spans):
    run = start(team, AGENT, ROUTER, echo("after", after=["route"]), input={"x": 2})
    for name in ("think", "route"):
        step_execute(step_id=step_of(run, name).id, worker="w")
    targets = {span.name: dict(span.attributes) for span in spans.get_finished_spans()
               if span.name.endswith(".call")}
    assert targets == {"agent.call": {"stepwise.target": "fast"},
                       "router.call": {"stepwise.target": "router"}}
    assert step_of(run, "route").output == {"route": "yes"}


def test_an_agent_step_is_charged_what_its_model_spent(team):
    run = start(team, AGENT)
    step_execute(step_id=step_of(run, "think").id, worker="w")
    step, run = step_of(run, "think"), Run.objects.get(id=run.id)
    cost = Decimal("0.0005")  # 1000 tokens at 0.25 $/Mtok in, 200 at 1.25 $/Mtok out
    assert (step.state, step.output) == ("completed", {"ok": True})
    assert (step.tokens_in, step.tokens_out, step.cost_usd) == (1000, 200, cost)
    assert (run.tokens_in, run.tokens_out, run.cost_usd) == (1000, 200, cost)
    attempt = StepAttempt.objects.get(step=step)
    assert (attempt.tokens_in, attempt.tokens_out, attempt.cost_usd) == (1000, 200, cost)
    assert (attempt.model, attempt.provider, attempt.model_id) == ("fast", "scripted", "scripted:fast")


def test_a_model_reply_is_found_by_the_workflow_and_step_it_is_for(team, settings, tmp_path):
    import json

    fixture = tmp_path / "replies.json"
    fixture.write_text(json.dumps({"worked.think": [{"output": {"from": "worked.think"}}],
                                   "other.think": [{"output": {"from": "other.think"}}]}))
    settings.STEPWISE_MODELS = {**settings.STEPWISE_MODELS,
                                "fixtured": {"provider": "scripted", "fixture": str(fixture)}}
    spec = {key: value for key, value in AGENT.items() if key != "script"}
    run = start(team, {**spec, "model": "fixtured"})
    step_execute(step_id=step_of(run, "think").id, worker="w")
    assert step_of(run, "think").output == {"from": "worked.think"}


# --- the reaper's timeout and an operator's retry --------------------------------------------


def test_a_timeout_closes_the_running_attempt_of_that_step_only(team, move_clock):
    from orchestrator.engine.services.kinds.worker import WorkerStep

    late, other = start(team, echo(retry=NO_RETRY), name="late"), start(team, echo(), name="other")
    step_claim(step_id=step_of(late).id, worker="w")
    step_claim(step_id=step_of(other).id, worker="w")
    move_clock(7)
    assert WorkerStep().time_out(step_id=step_of(late).id, reason="past its 5 s")
    attempt = StepAttempt.objects.get(step=step_of(late))
    assert (attempt.outcome, attempt.error_class, attempt.error_message) == (
        "timed_out", "timeout", "past its 5 s")
    assert attempt.finished_at == now()
    assert step_of(late).state == "timed_out"
    untouched = StepAttempt.objects.get(step=step_of(other))
    assert (untouched.outcome, untouched.finished_at) == ("", None)
    assert not WorkerStep().time_out(step_id=step_of(late).id, reason="again")  # not running


def test_retrying_a_step_of_a_failed_run_reopens_the_steps_the_failure_cancelled(team, operator):
    from orchestrator.engine.services.operators import step_retry

    run = start(team, echo(retry=NO_RETRY), echo("after", after=["work"]), on_error="fail")
    claim = step_claim(step_id=step_of(run).id, worker="w")
    step_fail(step_id=claim.step_id, attempt=1, error=StepError("permanent", "no"), usage=Usage(),
              worker="w")
    assert step_of(run, "after").state == "cancelled"
    step_retry(step_id=claim.step_id, actor=operator)
    after = step_of(run, "after")
    assert after.state == "blocked"
    [blocked] = events(after, "step.blocked")
    assert blocked.actor == "user:operator"


def test_each_attempt_of_a_model_step_reserves_its_budget_and_settles_what_it_spent(
        team, move_clock):
    from budgets.models import Reservation

    run = start(team, {**AGENT, "retry": RETRY}, budget={"max_cost_usd": 10})
    step = step_of(run, "think")
    step_claim(step_id=step.id, worker="w")
    step_fail(step_id=step.id, attempt=1, error=StepError("transient", "503"), usage=Usage(),
              worker="w")
    move_clock(1)
    assert step_retry_due(step_id=step.id)
    step_claim(step_id=step.id, worker="w")
    step_succeed(step_id=step.id, attempt=2, output={"ok": True},
                 usage=Usage(cost_usd=Decimal("0.002"), model="fast"), worker="w")
    assert list(Reservation.objects.filter(step=step).order_by("attempt").values_list(
        "attempt", "state", "actual")) == [(1, "settled", Decimal("0")),  # it spent nothing
                                           (2, "settled", Decimal("0.002"))]


def test_a_lease_runs_out_at_its_expiry_instant(team, move_clock, settings):
    run = start(team, echo(timeout_s=600))
    step_claim(step_id=step_of(run).id, worker="w")
    move_clock(settings.STEPWISE_LEASE_S)
    assert step_lease_expired(step_id=step_of(run).id)


# --- the messages sent after commit, taken at the broker's edge ------------------------------


@pytest.fixture
def broker(monkeypatch, django_capture_on_commit_callbacks):
    """Runs the on-commit callbacks of a block and keeps the messages they hand to Celery's
    `send_task` (the broker's edge; nothing reaches a broker): (task, args, options)."""
    from contextlib import contextmanager

    from celery import current_app

    sent: list[tuple[str, tuple, dict]] = []
    monkeypatch.setattr(current_app, "send_task", lambda name, args=None, **options: sent.append(
        (name.rsplit(".", 1)[-1], tuple(args or ()), options)))

    @contextmanager
    def committing():
        with django_capture_on_commit_callbacks(execute=True):
            yield sent

    return committing


def _named(options: dict) -> tuple:
    return options["headers"].get("stepwise_run"), options["headers"].get("stepwise_step")


def test_a_started_step_is_sent_to_its_queue(team, broker):
    with broker() as sent:
        run = start(team, echo())
    [(task, args, options)] = [message for message in sent if message[0] == "execute_step"]
    assert (task, args, options["queue"]) == ("execute_step", (step_of(run).id,), "tools")
    assert _named(options) == (str(run.id), "work")


def test_a_retry_due_soon_is_sent_with_its_delay_and_then_to_its_queue(team, broker, move_clock):
    run = start(team, echo(retry=RETRY))
    step = step_of(run)
    step_claim(step_id=step.id, worker="w")
    with broker() as sent:
        step_fail(step_id=step.id, attempt=1, error=StepError("transient", "503"), usage=Usage(),
                  worker="w")
    [(task, args, options)] = [message for message in sent if message[0] == "retry_due"]
    assert (args, options["countdown"], options["queue"]) == ((step.id,), 1.0, "orchestrator")
    assert _named(options) == (str(run.id), "work")
    move_clock(1)
    with broker() as sent:
        step_retry_due(step_id=step.id)
    [(task, args, options)] = [message for message in sent if message[0] == "execute_step"]
    assert (args, options["queue"], _named(options)) == ((step.id,), "tools", (str(run.id), "work"))


def test_a_lost_message_is_sent_again_to_the_same_queue(team, broker):
    run = start(team, echo())
    with broker() as sent:
        step_redispatch(step_id=step_of(run).id)
    [(task, args, options)] = sent
    assert (task, args, options["queue"]) == ("execute_step", (step_of(run).id,), "tools")
    assert _named(options) == (str(run.id), "work")


# --- the circuit breaker ----------------------------------------------------------------------


def test_transient_failures_open_a_dependency_breaker_and_a_success_closes_it(team, settings):
    from django.core.cache import cache

    settings.STEPWISE_BREAKER_FAILURES = 2
    down = {"name": "work", "type": "tool", "tool": "http.request", "retry": NO_RETRY,
            "params": {"method": "GET", "url": "http://127.0.0.1:9/down"}}
    dependency = "tool:http.request:127.0.0.1:9"
    try:
        for name in ("one", "two", "three"):
            run = start(team, down, name=name)
            step_execute(step_id=step_of(run).id, worker="w")
        attempts = StepAttempt.objects.filter(step__run__version__workflow__name__in=(
            "one", "two", "three")).order_by("id")
        classes = [attempt.error_class for attempt in attempts]
        assert classes[:2] in (["transient"] * 2, ["timeout"] * 2), classes
        assert attempts[2].error_message == f"circuit open for {dependency}"

        cache.set("cb:tool:core.echo:failures", 1, timeout=60)
        step_execute(step_id=step_of(start(team, echo(), name="fine")).id, worker="w")
        assert cache.get("cb:tool:core.echo:failures") is None
    finally:
        for dep in (dependency, "tool:core.echo"):
            cache.delete_many([f"cb:{dep}:until", f"cb:{dep}:probe", f"cb:{dep}:failures"])
