"""What the worker's claim, call and finish write, beyond tests/engine/test_worker.py: each
written for a surviving mutant of orchestrator/engine/services/kinds/worker.py (docs/testing.md).

A claim refused because its approval was withdrawn fails the step with the refusal, under the
worker's name; a claim hands the executor the run's sealed secrets; a claim, a fencing check and
a step's spec read in the statements they are meant to (one joined read for the claim, never the
definition JSON); a finished attempt is closed, and a heartbeat pushes a lease, for its own step
only; the worker's name is the actor of what its attempt leads to; the metrics observe the time
a step waited and ran and the model it spent on; a retry due within the broker's limit is sent
with its exact delay; a model call settles its own turn of its own attempt.
"""
import re
import time
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals.models import ApprovalRequest
from budgets.models import Reservation
from orchestrator.engine.dispatch import BROKER_DELAY_LIMIT_S
from orchestrator.engine.retry import StepError
from orchestrator.engine.services.kinds.agent import call_settle, repair_reserve
from orchestrator.engine.services.kinds.human_gate import approval_grant, approval_revoke
from orchestrator.engine.services.kinds.worker import (
    Usage,
    claim_holds,
    lease_extend,
    step_claim,
    step_execute,
    step_fail,
    step_spec,
    step_succeed,
)
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import DeadLetter, Run, StepAttempt
from orchestrator.operations import metrics
from tests.engine.conftest import HANDED
from tests.engine.test_worker import AGENT, RETRY, echo, events, sample, start, step_of
from tests.factories import SETUP

pytestmark = pytest.mark.django_db


def selects(fn) -> list[str]:
    """The SELECT statements `fn()` sends on this process's connection."""
    with CaptureQueriesContext(connection) as captured:
        fn()
    return [q["sql"] for q in captured.captured_queries if q["sql"].lstrip().upper().startswith("SELECT")]


# --- a claim refused at the gate ------------------------------------------------------------

GATED = [{"name": "approve", "type": "human_gate", "approvers": "support_leads"},
         echo("send", after=["approve"], retry={"max_attempts": 1})]


def test_a_step_whose_approval_was_withdrawn_is_refused_at_its_claim_under_the_worker_name(
        team, approver):
    run = start(team, *GATED)
    approval = ApprovalRequest.objects.get(run=run)
    approval_grant(approval_id=approval.id, user=approver, proposal_hash=approval.proposal_hash)
    approval_revoke(approval_id=approval.id, user=approver, note="The customer wrote again.")
    send = step_of(run, "send")
    assert send.state == "queued"

    assert step_claim(step_id=send.id, worker="w") is None

    send = step_of(run, "send")
    refusal = send.error["message"]
    assert refusal.startswith("gate 'approve': ") and refusal.endswith("; the action was not run")
    assert (send.state, send.error) == ("failed", {"class": "policy", "message": refusal, "attempts": 0})
    assert not StepAttempt.objects.filter(step=send).exists()  # the claim was not written
    [failed] = events(send, "step.failed")
    assert (failed.actor, failed.payload) == ("worker:w", send.error)
    letter = DeadLetter.objects.get(step=send)
    assert (letter.error_class, letter.error_message) == ("policy", refusal)
    assert Run.objects.get(id=run.id).state == "failed"


# --- what a claim hands the executor, and what it reads ----------------------------------------

# `handed` (tests/engine/conftest.py): the params each call of the tool HANDED was handed.


def test_the_executor_is_handed_the_secret_inputs_the_claim_read_with_the_step(team, handed):
    version, _ = workflow_save(team=team, definition={
        "name": "secretive", "steps": [{"name": "work", "type": "tool", "tool": HANDED,
                                        "params": {"code": "{{ input.code }}"}}],
        "input_schema": {"type": "object", "required": ["code"], "properties": {
            "code": {"type": "string", "writeOnly": True}}}}, actor=SETUP)
    run = run_start(version=version, input={"code": "s3cr3t-77"}, actor=SETUP)
    assert "s3cr3t-77" not in str(step_of(run).input)  # sealed in the database

    step_execute(step_id=step_of(run).id, worker="w")

    assert handed == [{"code": "s3cr3t-77"}]
    assert step_of(run).state == "completed"


def test_a_claim_reads_its_step_run_version_workflow_team_and_secrets_in_one_select(team):
    run = start(team, echo())
    step_id = step_of(run).id
    step_spec(step_id=step_id)  # the definition is cached per process, as in a worker
    claim = None

    def claiming():
        nonlocal claim
        claim = step_claim(step_id=step_id, worker="w")

    [read] = selects(claiming)
    assert claim is not None and claim.workflow == "worked" and claim.sealed_secrets is None
    for table in ("orchestrator_steprun", "orchestrator_run", "orchestrator_workflowversion",
                  "orchestrator_workflow", "orchestrator_team", "orchestrator_runsecret"):
        assert f'"{table}"' in read, table


def test_a_claim_does_not_read_the_workflow_definition_json(team):
    run = start(team, echo())
    step_id = step_of(run).id
    step_spec(step_id=step_id)
    read = " ".join(selects(lambda: step_claim(step_id=step_id, worker="w")))
    assert '"orchestrator_workflowversion"."digest"' in read
    assert '"orchestrator_workflowversion"."definition"' not in read
    assert '"orchestrator_workflowversion"."normalized"' not in read


@pytest.mark.parametrize("read, statements", [
    # The step's name, run and state (django-fsm's ConcurrentTransitionMixin reads the state
    # as the row loads: an `only()` without it costs a statement), then the run with its version.
    ("the spec of a step", 2),
    ("a fencing check", 1),  # the step's state and attempts, locked
])
def test_a_read_taken_around_a_claim_stays_within_its_statements(team, read, statements):
    run = start(team, echo())
    step = step_of(run)
    step_claim(step_id=step.id, worker="w")
    fn = {"the spec of a step": lambda: step_spec(step_id=step.id),
          "a fencing check": lambda: claim_holds(step_id=step.id, attempt=1)}[read]
    fn()  # the definition cache is warm
    assert len(selects(fn)) <= statements
    assert fn()  # still right: a spec, and the claim holds


# --- two deliveries of one step, at once --------------------------------------------------------


def claimed_at_once(step_id: int) -> list:
    """What two threads (two connections) claiming `step_id` at the same moment got: a Claim,
    None, or the exception raised."""
    import threading

    from django.db import connections

    together, outcomes = threading.Barrier(2), []

    def deliver(worker: str) -> None:
        try:
            together.wait()
            outcomes.append(step_claim(step_id=step_id, worker=worker))
        except Exception as error:  # noqa: BLE001 - the outcome under test
            outcomes.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=deliver, args=(f"w{n}",)) for n in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


@pytest.mark.django_db(transaction=True)
def test_two_deliveries_claiming_one_step_at_once_give_one_claim_and_one_stale_delivery(team):
    """A step's message delivered twice (a redispatch racing the first) is claimed by two
    worker processes at the same moment: one gets the claim, the other is told its delivery is
    stale (None) — never an error, never a second attempt."""
    for round_ in range(8):
        step_id = step_of(start(team, echo(), name=f"twice-{round_}")).id
        outcomes = claimed_at_once(step_id)
        claims = [o for o in outcomes if o is not None]
        assert len(claims) == 1 and not isinstance(claims[0], Exception), outcomes
        assert outcomes.count(None) == 1, outcomes
        assert list(StepAttempt.objects.filter(step_id=step_id).values_list("number", flat=True)) == [1]


# --- finishing an attempt ---------------------------------------------------------------------


def test_closing_an_attempt_leaves_the_attempts_of_other_steps_alone(team):
    done, other = start(team, echo(), name="done"), start(team, echo(), name="other")
    step_claim(step_id=step_of(done).id, worker="w")
    step_claim(step_id=step_of(other).id, worker="w")

    step_succeed(step_id=step_of(done).id, attempt=1, output={}, usage=Usage(tokens_in=3), worker="w")

    assert StepAttempt.objects.get(step=step_of(done)).outcome == "succeeded"
    untouched = StepAttempt.objects.get(step=step_of(other))
    assert (untouched.outcome, untouched.finished_at, untouched.tokens_in) == ("", None, 0)


def test_a_heartbeat_pushes_the_lease_of_its_own_step_only(team, move_clock):
    beating, other = start(team, echo(), name="beating"), start(team, echo(), name="other")
    step_claim(step_id=step_of(beating).id, worker="w")
    step_claim(step_id=step_of(other).id, worker="w")
    held = step_of(other).lease_expires_at
    move_clock(20)

    assert lease_extend(step_id=step_of(beating).id, attempt=1)

    assert step_of(beating).lease_expires_at > held
    assert step_of(other).lease_expires_at == held


def test_what_an_executed_step_leads_to_is_recorded_under_the_worker_name(team):
    run = start(team, echo(), echo("next", after=["work"]))
    step_execute(step_id=step_of(run).id, worker="w7")
    [completed] = events(step_of(run), "step.completed")
    assert completed.actor == "worker:w7"
    # The run moved on in the same transaction, by the same hand.
    assert [e.actor for e in events(step_of(run, "next"), "step.queued")] == ["worker:w7"]


def test_charging_a_usage_writes_the_run_totals_and_nothing_else_of_the_run(team):
    run = start(team, echo(retry=RETRY), input={"large": "x" * 100})
    step_claim(step_id=step_of(run).id, worker="w")
    with CaptureQueriesContext(connection) as captured:
        step_fail(step_id=step_of(run).id, attempt=1, error=StepError("transient", "503"),
                  usage=Usage(tokens_in=2, cost_usd=Decimal("0.01")), worker="w")
    updates = [q["sql"] for q in captured.captured_queries
               if q["sql"].startswith('UPDATE "orchestrator_run" ')]
    [charged] = updates
    written = re.findall(r'"(\w+)" = ', charged.split(" WHERE ")[0])
    assert sorted(written) == ["cost_usd", "tokens_in", "tokens_out"]  # not the run's input
    assert Run.objects.get(id=run.id).tokens_in == 2


# --- metrics ------------------------------------------------------------------------------------


@pytest.mark.parametrize("waited, observed", [(0.25, 0.25), (0, 0), (-5, 0)])
def test_the_scheduling_latency_observed_is_how_long_the_step_waited_queued(
        team, move_clock, waited, observed):
    run = start(team, echo())
    queue = step_of(run).queue
    before = sample(metrics.SCHEDULING_LATENCY, "_sum", {"queue": queue})
    move_clock(waited)  # negative: a worker's clock behind the one that queued it
    step_claim(step_id=step_of(run).id, worker="w")
    assert sample(metrics.SCHEDULING_LATENCY, "_sum", {"queue": queue}) - before == pytest.approx(observed)


def test_the_duration_observed_is_how_long_the_call_took(team):
    run = start(team, echo())
    labels = {"kind": "tool", "queue": step_of(run).queue, "outcome": "succeeded"}
    before = sample(metrics.STEP_DURATION, "_sum", labels)
    started = time.monotonic()
    step_execute(step_id=step_of(run).id, worker="w")
    took = time.monotonic() - started
    assert 0 <= sample(metrics.STEP_DURATION, "_sum", labels) - before <= took


def test_what_a_step_spent_is_counted_under_its_model(team):
    run = start(team, echo())
    before = sample(metrics.TOKENS, "_total", {"model": "m-counted", "direction": "in"})
    step_claim(step_id=step_of(run).id, worker="w")
    step_succeed(step_id=step_of(run).id, attempt=1, output={}, worker="w",
                 usage=Usage(tokens_in=11, tokens_out=2, model="m-counted"))
    assert sample(metrics.TOKENS, "_total", {"model": "m-counted", "direction": "in"}) == before + 11


# --- a retry's message --------------------------------------------------------------------------


@pytest.fixture
def sent_tasks(monkeypatch, django_capture_on_commit_callbacks):
    """Runs a block's on-commit callbacks and keeps what they hand Celery's `send_task`."""
    from contextlib import contextmanager

    from celery import current_app

    sent: list[tuple[str, dict]] = []
    monkeypatch.setattr(current_app, "send_task", lambda name, args=None, **options: sent.append(
        (name.rsplit(".", 1)[-1], options)))

    @contextmanager
    def committing():
        with django_capture_on_commit_callbacks(execute=True):
            yield sent

    return committing


@pytest.mark.parametrize("delay_s, countdown", [
    (0, 0), (0.5, 0.5), (BROKER_DELAY_LIMIT_S, BROKER_DELAY_LIMIT_S), (BROKER_DELAY_LIMIT_S + 0.5, None),
])
def test_a_retry_due_within_the_broker_limit_is_sent_with_its_exact_delay(
        team, move_clock, sent_tasks, delay_s, countdown):
    run = start(team, echo(retry={**RETRY, "base_s": delay_s, "max_s": delay_s}))
    step_claim(step_id=step_of(run).id, worker="w")
    with sent_tasks() as sent:
        step_fail(step_id=step_of(run).id, attempt=1, error=StepError("transient", "503"),
                  usage=Usage(), worker="w")
    assert step_of(run).state == "retrying"
    assert [options["countdown"] for task, options in sent if task == "retry_due"] == (
        [] if countdown is None else [countdown])


# --- a model call's settlement ------------------------------------------------------------------


def test_a_model_call_settles_its_own_turn_of_its_own_attempt(team):
    run = start(team, AGENT, budget={"max_cost_usd": 10})
    step = step_of(run, "think")
    step_claim(step_id=step.id, worker="w")
    repair_reserve(1, step_id=step.id, attempt=1)  # a repair turn, reserved before its call

    call_settle(0, Decimal("0.03"), step_id=step.id, attempt=1)

    assert list(Reservation.objects.filter(step=step).order_by("turn").values_list(
        "attempt", "turn", "state", "actual")) == [(1, 0, "settled", Decimal("0.03")),
                                                   (1, 1, "reserved", None)]
