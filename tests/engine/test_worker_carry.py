"""Eager dispatch (`worker.Carry`): a worker whose step succeeds claims the run's next step in
that transaction and runs it itself, within the carry's bounds; everything else is dispatched.

Each test drives `step_execute` as the worker's task does, with a carry for the queue its
message came from, and reads what was claimed, run and dispatched (the on-commit callbacks
that would send `execute_step`).
"""
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals.models import ApprovalRequest
from orchestrator.engine.services.kinds.human_gate import approval_grant, approval_revoke
from orchestrator.engine.services.kinds.worker import (
    Carry,
    Usage,
    step_claim,
    step_execute,
    step_succeed,
)
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, Run, StepAttempt
from tests.engine.conftest import HANDED
from tests.engine.test_worker import echo, messages, start, step_of
from tests.factories import SETUP
from tests.support.children import start_children

pytestmark = pytest.mark.django_db

CHAIN = [echo("s0"), echo("s1", after=["s0"]), echo("s2", after=["s1"])]


def carry(queue="tools", *, steps=10, seconds=60.0) -> Carry:
    return Carry(queue, steps, time.monotonic() + seconds)


def dispatched(callbacks) -> list:
    return messages(callbacks, "step_dispatch_on_commit")


def kinds(run: Run, step: str) -> list[str]:
    return list(Event.objects.filter(run=run, step__name=step).order_by("id")
                .values_list("kind", flat=True))


def test_a_chain_runs_on_its_first_message_each_step_claimed_in_the_transaction_that_started_it(
        team, django_capture_on_commit_callbacks):
    run = start(team, *CHAIN)

    with django_capture_on_commit_callbacks() as callbacks:
        assert step_execute(step_id=step_of(run, "s0").id, worker="w", carry=carry()) == 0

    assert Run.objects.get(id=run.id).state == "completed"
    assert dispatched(callbacks) == []  # s1 and s2 were never messages
    for name in ("s1", "s2"):
        step = step_of(run, name)
        assert (step.state, step.attempts, step.queue) == ("completed", 1, "tools")
        assert kinds(run, name) == ["step.ready", "step.queued", "step.running", "step.completed"]
        [attempt] = StepAttempt.objects.filter(step=step)
        assert (attempt.worker, attempt.outcome) == ("w", "succeeded")
        assert attempt.idempotency_key  # the same key a claim of its own would have given it
    running = Event.objects.get(run=run, step__name="s1", kind="step.running")
    assert (running.actor, running.payload) == ("worker:w", {"attempt": 1})


def test_a_success_hands_its_carry_the_next_step_the_scheduler_claimed_for_it(
        team, django_capture_on_commit_callbacks):
    """The carry is handed to `step_succeed`, which passes it to the scheduler and hands it back
    the step taken: no state held outside the call."""
    run = start(team, *CHAIN)
    s0 = step_of(run, "s0")
    claim = step_claim(step_id=s0.id, worker="w")
    taking = carry()
    taking.worker = "w"

    with django_capture_on_commit_callbacks() as callbacks:
        assert step_succeed(step_id=s0.id, attempt=claim.attempt, output={}, usage=Usage(),
                            worker="w", carry=taking)

    assert dispatched(callbacks) == []
    taken = taking.take()
    assert (taken.step_id, taken.attempt) == (step_of(run, "s1").id, 1)
    assert (step_of(run, "s1").state, step_of(run, "s1").lease_owner) == ("running", "w")
    assert taking.steps == 9 and taking.take() is None


def test_a_carried_step_costs_no_claim_of_its_own(team):
    """The claim's SELECT and its transaction are what carrying saves: a carried step is one
    transaction, where a step claimed from its message is two."""
    run = start(team, *CHAIN)
    s0 = step_of(run, "s0").id

    with CaptureQueriesContext(connection) as captured:
        step_execute(step_id=s0, worker="w", carry=carry())

    begins = [q for q in captured.captured_queries if q["sql"].upper().startswith(("BEGIN", "SAVEPOINT"))]
    assert len(begins) == 2 + 1 + 1  # s0: claim + succeed; s1 and s2: their succeed only


def test_the_carry_stops_after_its_number_of_steps(team, django_capture_on_commit_callbacks):
    run = start(team, *CHAIN)

    with django_capture_on_commit_callbacks() as callbacks:
        step_execute(step_id=step_of(run, "s0").id, worker="w", carry=carry(steps=1))

    assert [step_of(run, n).state for n in ("s0", "s1", "s2")] == ["completed", "completed", "queued"]
    [send] = dispatched(callbacks)
    assert not StepAttempt.objects.filter(step=step_of(run, "s2")).exists()


def test_the_carry_stops_once_its_message_has_run_its_time(team, django_capture_on_commit_callbacks):
    run = start(team, *CHAIN)

    with django_capture_on_commit_callbacks() as callbacks:
        step_execute(step_id=step_of(run, "s0").id, worker="w", carry=carry(seconds=0))

    assert [step_of(run, n).state for n in ("s0", "s1", "s2")] == ["completed", "queued", "blocked"]
    assert len(dispatched(callbacks)) == 1


def test_a_step_on_another_queue_than_the_message_is_dispatched(team, django_capture_on_commit_callbacks):
    run = start(team, *CHAIN)

    with django_capture_on_commit_callbacks() as callbacks:
        step_execute(step_id=step_of(run, "s0").id, worker="w", carry=carry("orchestrator"))

    assert step_of(run, "s1").state == "queued"
    assert len(dispatched(callbacks)) == 1


def test_without_a_carry_every_step_is_a_message(team, django_capture_on_commit_callbacks):
    run = start(team, *CHAIN)

    with django_capture_on_commit_callbacks() as callbacks:
        step_execute(step_id=step_of(run, "s0").id, worker="w")

    assert step_of(run, "s1").state == "queued"
    assert len(dispatched(callbacks)) == 1
    assert Carry.for_message(None) is None  # a message with no routing key carries nothing


def test_a_message_carries_as_the_settings_say(settings):
    settings.STEPWISE_CARRY_STEPS, settings.STEPWISE_CARRY_S = 4, 2.0
    before = time.monotonic()
    made = Carry.for_message("tools")
    assert (made.queue, made.steps, made.taken) == ("tools", 4, None)
    assert before + 2.0 <= made.until <= time.monotonic() + 2.0

    settings.STEPWISE_CARRY_STEPS = 0
    assert Carry.for_message("tools") is None  # turned off


def test_of_a_fan_out_one_step_is_carried_and_the_others_are_dispatched(
        team, django_capture_on_commit_callbacks):
    run = start(team, echo("s0"), echo("a", after=["s0"]), echo("b", after=["s0"]),
                echo("c", after=["s0"]))

    with django_capture_on_commit_callbacks() as callbacks:
        step_execute(step_id=step_of(run, "s0").id, worker="w", carry=carry())

    states = sorted(step_of(run, n).state for n in "abc")
    assert states == ["completed", "queued", "queued"]
    assert len(dispatched(callbacks)) == 2


def test_a_step_under_a_shared_rate_limit_is_not_carried(team, settings, django_capture_on_commit_callbacks):
    settings.STEPWISE_RATE_LIMITS = {"tool:core.echo": 1000}
    run = start(team, *CHAIN)

    with django_capture_on_commit_callbacks() as callbacks:
        step_execute(step_id=step_of(run, "s0").id, worker="w", carry=carry())

    assert step_of(run, "s1").state == "queued"  # its message takes a slot of the limit first
    assert len(dispatched(callbacks)) == 1


GUARDED = [{"name": "approve", "type": "human_gate", "approvers": "support_leads"},
           echo("prep"), echo("send", after=["approve", "prep"], retry={"max_attempts": 1})]


def test_a_guarded_step_is_carried_only_while_its_approval_holds(
        team, approver, django_capture_on_commit_callbacks):
    held, withdrawn = start(team, *GUARDED, name="held"), start(team, *GUARDED, name="withdrawn")
    for run in (held, withdrawn):
        approval = ApprovalRequest.objects.get(run=run)
        approval_grant(approval_id=approval.id, user=approver, proposal_hash=approval.proposal_hash)
    approval = ApprovalRequest.objects.get(run=withdrawn)
    approval_revoke(approval_id=approval.id, user=approver, note="The customer wrote again.")

    for run in (held, withdrawn):
        with django_capture_on_commit_callbacks() as callbacks:
            step_execute(step_id=step_of(run, "prep").id, worker="w", carry=carry())
        run.sent = dispatched(callbacks)

    assert step_of(held, "send").state == "completed" and held.sent == []
    send = step_of(withdrawn, "send")
    assert send.state == "queued" and len(withdrawn.sent) == 1  # not claimed here
    assert not StepAttempt.objects.filter(step=send).exists()
    assert step_claim(step_id=send.id, worker="w") is None  # its own message refuses it
    assert step_of(withdrawn, "send").error["class"] == "policy"


FLAKY = "test.carry_flaky"


@pytest.fixture
def flaky():
    """A tool that always fails transiently; registered for one test only."""
    from orchestrator.engine.retry import StepError
    from orchestrator.integrations.tools import registry

    @registry.tool(FLAKY, params_schema={"type": "object"})
    def carry_flaky(params, ctx):
        raise StepError("transient", "flaky")

    yield
    registry._TOOLS.pop(FLAKY, None)


def test_a_carried_step_that_fails_ends_the_carry_and_retries_through_the_broker(
        team, flaky, django_capture_on_commit_callbacks):
    retry = {"max_attempts": 2, "base_s": 1, "max_s": 1, "jitter": False, "backoff": "fixed"}
    run = start(team, echo("s0"), {"name": "s1", "type": "tool", "tool": FLAKY, "after": ["s0"],
                                  "retry": retry}, echo("s2", after=["s1"]))

    with django_capture_on_commit_callbacks() as callbacks:
        step_execute(step_id=step_of(run, "s0").id, worker="w", carry=carry())

    s1 = step_of(run, "s1")
    assert (s1.state, s1.attempts) == ("retrying", 1)
    assert StepAttempt.objects.get(step=s1).outcome == "failed"
    assert messages(callbacks, "retry_due_on_commit")  # its retry is a message again
    assert step_of(run, "s2").state == "blocked"


def test_a_carried_step_is_handed_the_run_s_secret_inputs(team, handed):
    version, _ = workflow_save(team=team, definition={
        "name": "secretive", "input_schema": {"type": "object", "required": ["code"], "properties": {
            "code": {"type": "string", "writeOnly": True}}},
        "steps": [echo("s0"), {"name": "use", "type": "tool", "tool": HANDED, "after": ["s0"],
                               "params": {"code": "{{ input.code }}"}}]}, actor=SETUP)
    run = run_start(version=version, input={"code": "s3cr3t-77"}, actor=SETUP)

    step_execute(step_id=step_of(run, "s0").id, worker="w", carry=carry())

    assert handed == [{"code": "s3cr3t-77"}]
    assert step_of(run, "use").state == "completed"


def test_a_child_run_s_first_step_is_handed_the_child_s_own_secret_inputs(team, handed):
    """A sub-workflow started by a carried success sends its child to a worker (the child is
    never created in the parent's transaction); the child's first step is handed the secrets
    sealed for the child (its input names them differently from the parent's)."""
    secret = {"type": "object", "required": ["code"], "properties": {
        "code": {"type": "string", "writeOnly": True}}}
    child, _ = workflow_save(team=team, definition={
        "name": "child", "input_schema": {"type": "object", "required": ["pin"], "properties": {
            "pin": {"type": "string", "writeOnly": True}}},
        "steps": [{"name": "use", "type": "tool", "tool": HANDED,
                   "params": {"pin": "{{ input.pin }}"}}]}, actor=SETUP)
    parent, _ = workflow_save(team=team, definition={
        "name": "parent", "input_schema": secret,
        "steps": [echo("s0"), {"name": "sub", "type": "sub_workflow", "workflow": "child",
                               "input": {"pin": "{{ input.code }}"}, "after": ["s0"]}]}, actor=SETUP)
    run = run_start(version=parent, input={"code": "s3cr3t-77"}, actor=SETUP)

    step_execute(step_id=step_of(run, "s0").id, worker="w", carry=carry())
    assert handed == [] and step_of(run, "sub").state == "waiting"

    [child_run] = start_children(run)
    step_execute(step_id=step_of(child_run, "use").id, worker="w", carry=carry())
    assert handed == [{"pin": "s3cr3t-77"}]
    assert step_of(child_run, "use").state == "completed"


def test_a_carry_reads_a_dependency_s_breaker_once_while_its_calls_succeed(team):
    """The chain's three steps call the same tool: its breaker is read for the first, found
    closed with nothing counted, and the two carried steps after that success do not read it."""
    from unittest import mock

    from orchestrator.engine import limits

    run = start(team, *CHAIN)
    with mock.patch.object(limits, "breaker_read", wraps=limits.breaker_read) as read:
        step_execute(step_id=step_of(run, "s0").id, worker="w", carry=carry())
    assert Run.objects.get(id=run.id).state == "completed"
    assert [c.args for c in read.call_args_list] == [("tool:core.echo",)]


def test_a_breaker_found_with_a_failure_counted_is_read_again_at_the_next_carried_step(team):
    from unittest import mock

    from django.core.cache import cache

    from orchestrator.engine import limits

    run = start(team, *CHAIN)
    cache.set("cb:tool:core.echo:failures", 1, timeout=60)
    try:
        with mock.patch.object(limits, "breaker_read", wraps=limits.breaker_read) as read:
            step_execute(step_id=step_of(run, "s0").id, worker="w", carry=carry())
    finally:
        cache.delete_many(["cb:tool:core.echo:until", "cb:tool:core.echo:probe",
                           "cb:tool:core.echo:failures"])
    assert Run.objects.get(id=run.id).state == "completed"
    # s0 found a failure counted (its success reset it): s1 read the breaker again, found it
    # clean, and s2 went on s1's reading.
    assert read.call_count == 2
