"""The reaper's sweeps, each driven directly with a controlled clock: a running step past its
timeout, a run past its deadline (`budget.max_duration_s`), an approval past its deadline, a
run that stopped moving (`run.stuck`) and a finished child whose parent was not told.

Runs are driven in this process through the services a worker calls; the test transaction
never commits, so no message is consumed and nothing races the assertions.
"""
import pytest

from approvals.models import ApprovalRequest
from orchestrator.engine.errors import NotAllowed
from orchestrator.engine.services import reaper
from orchestrator.engine.services.kinds.human_gate import approval_grant
from orchestrator.engine.services.kinds.worker import Usage, step_claim, step_succeed
from orchestrator.engine.services.operators import run_budget_raise, run_resume
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import DeadLetter, Event, Run, StepRun
from tests.factories import SETUP
from tests.support.children import start_children

pytestmark = pytest.mark.django_db


def start(team, *steps, **definition):
    version, _ = workflow_save(team=team, definition={
        "name": definition.pop("name", "reaped"), "input_schema": {"type": "object"},
        "steps": list(steps), **definition}, actor=SETUP)
    return run_start(version=version, input={}, actor=SETUP)


def echo(name="work", **extra):
    return {"name": name, "type": "tool", "tool": "core.echo", **extra}


def claim(run: Run, name: str = "work"):
    return step_claim(step_id=run.steps.get(name=name).id, worker="test")


def state_of(run: Run, name: str | None = None) -> str:
    if name is None:
        return Run.objects.get(pk=run.pk).state
    return StepRun.objects.get(run=run, name=name).state


# --- a running step past its timeout ----------------------------------------------------------


def test_a_running_step_past_its_timeout_is_timed_out_dead_lettered_and_fails_the_run(team, move_clock):
    run = start(team, echo(timeout_s=10))
    claim(run)

    move_clock(9.9)
    assert reaper.reap()["timed_out"] == 0 and state_of(run, "work") == "running"

    move_clock(10.1)
    assert reaper.reap()["timed_out"] == 1
    step = run.steps.get(name="work")
    assert (step.state, step.error["class"]) == ("timed_out", "timeout")
    assert list(step.attempt_records.values_list("outcome", "error_class")) == [("timed_out", "timeout")]
    assert DeadLetter.objects.get(step=step).error_class == "timeout"
    assert state_of(run) == "failed"


def test_a_step_timeout_is_retried_when_the_policy_allows_it(team, move_clock):
    run = start(team, echo(timeout_s=10, retry={"max_attempts": 2, "base_s": 1, "jitter": False}))
    claim(run)
    move_clock(11)
    reaper.reap()
    assert state_of(run, "work") == "retrying"
    move_clock(12.5)  # the retry is due one base delay later
    assert reaper.reap()["retries"] == 1 and state_of(run, "work") == "queued"
    assert claim(run).attempt == 2


def test_a_late_result_after_the_timeout_changes_nothing(team, move_clock):
    run = start(team, echo(timeout_s=10))
    attempt = claim(run).attempt
    move_clock(11)
    reaper.reap()
    assert not step_succeed(step_id=run.steps.get(name="work").id, attempt=attempt,
                            output={"late": True}, usage=Usage(), worker="test")
    assert state_of(run, "work") == "timed_out"


# --- a run past its deadline (budget.max_duration_s) -------------------------------------------


def test_a_run_past_max_duration_with_the_fail_policy_is_timed_out_and_its_steps_stopped(team, move_clock, long_lease):
    run = start(team, echo(), echo("next", after=["work"]),
                budget={"max_duration_s": 30, "on_duration": "fail"})
    assert (run.deadline_at - run.started_at).total_seconds() == 30
    attempt = claim(run).attempt

    move_clock(29.9)
    assert reaper.reap()["runs_timed_out"] == 0 and state_of(run) == "running"

    move_clock(30.1)
    assert reaper.reap()["runs_timed_out"] == 1
    run.refresh_from_db()
    assert run.state == "timed_out"
    assert run.error == {"class": "timeout", "message": "the run exceeded budget.max_duration_s"}
    assert state_of(run, "next") == "cancelled"
    # The running step is stopped by the reaper, not left to its worker: its attempt ends.
    work = run.steps.get(name="work")
    assert work.state == "cancelled"
    assert list(work.attempt_records.values_list("outcome", "error_class")) == [("stopped", "budget")]
    assert Event.objects.filter(step=work, kind="step.cancelled", actor="service:reaper").exists()
    assert not step_succeed(step_id=work.id, attempt=attempt, output={}, usage=Usage(), worker="test")
    assert reaper.reap()["runs_timed_out"] == 0  # once


def test_a_paused_run_past_max_duration_with_the_fail_policy_is_timed_out(team, move_clock, settings):
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"
    thinker = {"name": "think", "type": "agent", "model": "fast", "prompt": "hi",
               "output_schema": {"type": "object"}}
    run = start(team, thinker, budget={"max_cost_usd": 0.05, "max_duration_s": 30, "on_duration": "fail"})
    assert state_of(run) == "paused"  # its step would cross the cost limit

    move_clock(31)
    assert reaper.reap()["runs_timed_out"] == 1
    assert state_of(run) == "timed_out" and state_of(run, "think") == "cancelled"


def test_a_run_past_max_duration_is_paused_by_default_and_its_running_step_held(team, move_clock, long_lease):
    run = start(team, echo(), echo("next", after=["work"]), budget={"max_duration_s": 30})
    assert run.version.normalized["budget"]["on_duration"] == "pause"
    attempt = claim(run).attempt

    move_clock(30.1)
    report = reaper.reap()
    assert (report["runs_paused"], report["runs_timed_out"]) == (1, 0)
    run.refresh_from_db()
    assert run.state == "paused"
    assert run.error == {"class": "budget", "level": "run.duration", "step": "", "limit_s": 30,
                         "elapsed_s": 30, "message": "elapsed 30s exceeds the budget of 30s"}
    work = run.steps.get(name="work")
    assert (work.state, work.error["class"]) == ("retrying", "budget")
    assert list(work.attempt_records.values_list("outcome", "error_class")) == [("stopped", "budget")]
    held = Event.objects.get(step=work, kind="step.retrying")
    assert (held.actor, held.payload["held"]) == ("service:reaper", True)
    assert Event.objects.filter(run=run, kind="run.paused", actor="service:reaper").exists()
    # The worker that was running it comes back too late: its result is stale.
    assert not step_succeed(step_id=work.id, attempt=attempt, output={}, usage=Usage(), worker="test")
    assert state_of(run, "next") == "blocked"
    # Paused with nothing running: the sweep leaves it to an operator, and retries nothing.
    move_clock(60)
    report = reaper.reap()
    assert (report["runs_paused"], report["retries"]) == (0, 0) and state_of(run, "work") == "retrying"


def test_a_paused_over_duration_run_completes_after_an_operator_raises_its_duration(
        team, operator, move_clock, long_lease):
    run = start(team, echo(), echo("next", after=["work"]), budget={"max_duration_s": 30})
    claim(run)
    move_clock(31)
    reaper.reap()
    assert state_of(run) == "paused"

    run_budget_raise(run_id=run.id, max_duration_s=120, reason="slow remote today", actor=operator)

    run.refresh_from_db()
    assert run.state == "running"
    assert (run.deadline_at - run.started_at).total_seconds() == 120
    raised = Event.objects.get(run=run, kind="budget.overridden")
    assert raised.payload == {"reason": "slow remote today", "max_duration_s": 120}
    assert run.budget_overrides.get().max_cost_usd is None
    # The held step is due: the reaper queues a new attempt, and the run goes on to the end.
    assert reaper.reap()["retries"] == 1 and state_of(run, "work") == "queued"
    finish(run, "work")
    finish(run, "next")
    assert state_of(run) == "completed"
    assert reaper.reap()["runs_paused"] == 0


def test_resuming_an_over_duration_run_without_raising_pauses_it_again(team, operator, move_clock, long_lease):
    run = start(team, echo(), echo("next", after=["work"]), budget={"max_duration_s": 30})
    claim(run)
    move_clock(31)
    reaper.reap()
    run_resume(run_id=run.id, actor=operator)
    assert state_of(run) == "running"

    reaper.reap()  # the held step is due: its dispatch finds the run still past its deadline
    run.refresh_from_db()
    assert (run.state, run.error["level"]) == ("paused", "run.duration")
    assert state_of(run, "work") == "retrying"  # never queued: the run paused first


@pytest.fixture
def long_lease(settings):
    """The worker running a step keeps its lease through the test (as its heartbeat would), so
    the reaper stops the step for the run's deadline, not as a lost attempt."""
    settings.STEPWISE_LEASE_S = 3600


def finish(run: Run, name: str) -> None:
    step_succeed(step_id=run.steps.get(name=name).id, attempt=claim(run, name).attempt, output={},
                 usage=Usage(), worker="test")


def test_a_run_without_max_duration_has_no_deadline(team, move_clock):
    run = start(team, echo())
    assert run.deadline_at is None
    move_clock(10 * 24 * 3600)
    assert reaper.reap()["runs_timed_out"] == 0


def test_max_duration_also_holds_back_a_step_not_yet_dispatched(team, move_clock):
    """The budget check before dispatch refuses a step once the elapsed time is over budget,
    even before the reaper's sweep ends the run."""
    run = start(team, echo(), echo("next", after=["work"]), budget={"max_duration_s": 30})
    attempt = claim(run).attempt
    move_clock(31)
    step_succeed(step_id=run.steps.get(name="work").id, attempt=attempt, output={}, usage=Usage(),
                 worker="test")
    run.refresh_from_db()
    assert run.state == "paused"
    assert run.error["class"] == "budget" and "exceeds the budget of 30s" in run.error["message"]
    assert state_of(run, "next") == "ready"


# --- an approval past its deadline -------------------------------------------------------------


def test_an_approval_past_its_deadline_expires_and_can_no_longer_be_decided(team, approver, move_clock):
    run = start(team, {"name": "approve", "type": "human_gate", "approvers": "support_leads",
                       "timeout_s": 600}, echo("send", after=["approve"]))
    approval = ApprovalRequest.objects.get(run=run)

    move_clock(599)
    assert reaper.reap()["timed_out"] == 0
    move_clock(601)
    assert reaper.reap()["timed_out"] == 1

    approval.refresh_from_db()
    assert approval.state == "expired"
    assert state_of(run, "approve") == "timed_out" and state_of(run, "send") == "cancelled"
    assert state_of(run) == "failed"
    with pytest.raises(NotAllowed):
        approval_grant(approval_id=approval.id, user=approver, proposal_hash=approval.proposal_hash,
                       note="too late")


# --- a run that stopped moving ------------------------------------------------------------------


def test_a_running_run_that_stopped_moving_is_flagged_once(team, move_clock):
    stuck = start(team, echo(), name="stuck")  # its step stays queued: no worker ever takes it
    move_clock(reaper.STUCK_AFTER.total_seconds() - 1)
    assert reaper.reap()["stuck"] == 0

    move_clock(reaper.STUCK_AFTER.total_seconds() + 1)
    assert reaper.reap()["stuck"] == 1
    flagged = Event.objects.get(run=stuck, kind="run.stuck")
    assert flagged.payload == {"since": stuck.progressed_at.isoformat()}
    assert flagged.actor == "service:reaper"
    assert reaper.reap()["stuck"] == 0  # flagged once, not on every sweep


def test_a_waiting_run_is_never_flagged_stuck(team, move_clock):
    waiting = start(team, {"name": "approve", "type": "human_gate", "approvers": "support_leads",
                           "timeout_s": 10**6})
    assert state_of(waiting) == "waiting"
    move_clock(reaper.STUCK_AFTER.total_seconds() * 10)
    assert reaper.reap()["stuck"] == 0
    assert not Event.objects.filter(run=waiting, kind="run.stuck").exists()


# --- a finished child whose parent was not told -------------------------------------------------


def test_a_finished_child_is_carried_into_its_waiting_parent_by_the_sweep(team):
    workflow_save(team=team, definition={"name": "child", "input_schema": {"type": "object"},
                                         "steps": [echo("only", params={"v": 7})]}, actor=SETUP)
    parent = start(team, {"name": "call", "type": "sub_workflow", "workflow": "child", "input": {}},
                   name="parent")
    [child] = start_children(parent)
    attempt = claim(child, "only").attempt
    step_succeed(step_id=child.steps.get(name="only").id, attempt=attempt, output={"v": 7},
                 usage=Usage(), worker="test")
    assert state_of(child) == "completed"
    # The child's notice to its parent is sent after commit, which never comes in this test:
    # exactly the message a crash loses.
    assert state_of(parent, "call") == "waiting"

    assert reaper.reap()["children"] == 1
    assert StepRun.objects.get(run=parent, name="call").output == {"only": {"v": 7}}
    assert state_of(parent) == "completed"
    assert reaper.reap()["children"] == 0


def test_a_child_still_running_is_left_alone_by_the_sweep(team):
    workflow_save(team=team, definition={"name": "child", "input_schema": {"type": "object"},
                                         "steps": [echo("only")]}, actor=SETUP)
    parent = start(team, {"name": "call", "type": "sub_workflow", "workflow": "child", "input": {}},
                   name="parent")
    assert reaper.reap()["children"] == 0
    assert state_of(parent, "call") == "waiting"
