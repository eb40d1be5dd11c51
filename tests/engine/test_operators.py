"""An operator's second chances, through the services the API and the admin call: `run_resume`
of a paused run and `step_retry` of a failed step (of a paused run, or of a failed one, which
reopens). Who may do them is tests/test_permissions.py; this is what they do to the run.

Steps are finished in this process through the services a worker calls; the test transaction
never commits, so no message is consumed.
"""
import pytest

from orchestrator.engine.errors import NotAllowed
from orchestrator.engine.retry import StepError
from orchestrator.engine.services.kinds.worker import Usage, step_claim, step_fail, step_succeed
from orchestrator.engine.services.operators import run_resume, step_retry
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import DeadLetter, Event, Run, StepRun
from tests.factories import SETUP

pytestmark = pytest.mark.django_db
BOOM = StepError("permanent", "the remote said no")


def start(team, *, on_error="pause"):
    definition = {"name": "ops", "input_schema": {"type": "object"}, "on_error": on_error,
                  "steps": [{"name": "call", "type": "tool", "tool": "core.echo"},
                            {"name": "after", "type": "tool", "tool": "core.echo", "after": ["call"]}]}
    version, _ = workflow_save(team=team, definition=definition, actor=SETUP)
    return run_start(version=version, input={}, actor=SETUP)


def finish(run: Run, name: str, *, error: StepError | None = None) -> None:
    step = run.steps.get(name=name)
    claim = step_claim(step_id=step.id, worker="test")
    assert claim is not None, f"{name} is {step.state}, not queued"
    if error:
        step_fail(step_id=step.id, attempt=claim.attempt, error=error, usage=Usage(), worker="test")
    else:
        step_succeed(step_id=step.id, attempt=claim.attempt, output={"ok": name}, usage=Usage(),
                     worker="test")


def states(run: Run) -> tuple[str, dict]:
    run = Run.objects.get(pk=run.pk)
    return run.state, dict(run.steps.values_list("name", "state"))


# --- step retry ------------------------------------------------------------------------------


def test_retrying_a_failed_step_of_a_paused_run_runs_it_again_and_the_run_goes_on(team, operator):
    run = start(team)
    finish(run, "call", error=BOOM)
    assert states(run) == ("paused", {"call": "failed", "after": "blocked"})
    letter = DeadLetter.objects.get(run=run)

    step_retry(step_id=run.steps.get(name="call").id, actor=operator)

    assert states(run) == ("running", {"call": "queued", "after": "blocked"})
    step = StepRun.objects.get(run=run, name="call")
    assert (step.attempts, step.error, step.finished_at) == (1, None, None)
    letter.refresh_from_db()
    assert letter.status == "redriven"
    queued = Event.objects.filter(step=step, kind="step.queued").last()
    assert (queued.actor, queued.payload) == ("user:operator", {"reason": "operator retry"})

    finish(run, "call")
    assert StepRun.objects.get(pk=step.pk).attempts == 2
    finish(run, "after")
    assert states(run) == ("completed", {"call": "completed", "after": "completed"})


def test_retrying_a_failed_step_of_a_failed_run_reopens_the_run(team, operator):
    run = start(team, on_error="fail")
    finish(run, "call", error=BOOM)
    assert states(run) == ("failed", {"call": "failed", "after": "cancelled"})

    step_retry(step_id=run.steps.get(name="call").id, actor=operator)

    assert states(run) == ("running", {"call": "queued", "after": "blocked"})
    reopened = Run.objects.get(pk=run.pk)
    assert (reopened.error, reopened.finished_at) == (None, None)
    finish(run, "call")
    finish(run, "after")
    assert states(run)[0] == "completed"


@pytest.mark.parametrize("finished", [False, True])
def test_only_a_failed_step_can_be_retried(team, operator, finished):
    run = start(team)
    if finished:
        finish(run, "call")
    expected = "completed" if finished else "queued"
    with pytest.raises(NotAllowed, match=f"is {expected}, not failed"):
        step_retry(step_id=run.steps.get(name="call").id, actor=operator)


def test_a_step_of_a_cancelled_run_cannot_be_retried(team, operator):
    run = start(team, on_error="fail")
    finish(run, "call", error=BOOM)
    Run.objects.filter(pk=run.pk).update(state="cancelled")  # fixture: a run that has ended otherwise
    with pytest.raises(NotAllowed):
        step_retry(step_id=run.steps.get(name="call").id, actor=operator)
    assert StepRun.objects.get(run=run, name="call").state == "failed"


def test_a_gate_cannot_be_retried(team, operator):
    version, _ = workflow_save(team=team, definition={
        "name": "gated", "input_schema": {"type": "object"}, "on_error": "pause",
        "steps": [{"name": "gate", "type": "human_gate", "approvers": "x"}]}, actor=SETUP)
    run = run_start(version=version, input={}, actor=SETUP)
    StepRun.objects.filter(run=run).update(state="failed")
    with pytest.raises(NotAllowed, match="cannot be run again"):
        step_retry(step_id=run.steps.get().id, actor=operator)


# --- run resume ------------------------------------------------------------------------------


def test_resuming_a_run_paused_by_its_budget_dispatches_the_held_step(team, operator, settings):
    # A model step with no cost history is estimated at the default step cost.
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "1.00"
    version, _ = workflow_save(team=team, definition={
        "name": "thinker", "input_schema": {"type": "object"}, "on_error": "pause",
        "budget": {"max_cost_usd": 0.5},
        "steps": [{"name": "think", "type": "agent", "model": "fast", "prompt": "hi",
                   "output_schema": {"type": "object"}}]}, actor=SETUP)
    paused = run_start(version=version, input={}, actor=SETUP)
    assert states(paused) == ("paused", {"think": "ready"})
    assert paused.error["class"] == "budget"

    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"  # the estimate an operator corrected
    run_resume(run_id=paused.id, actor=operator)

    assert states(paused) == ("running", {"think": "queued"})
    resumed = Event.objects.filter(run=paused, kind="run.running").last()
    assert resumed.actor == "user:operator"


def test_a_resumed_run_still_over_budget_pauses_again(team, operator, settings):
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "1.00"
    version, _ = workflow_save(team=team, definition={
        "name": "thinker", "input_schema": {"type": "object"}, "budget": {"max_cost_usd": 0.5},
        "steps": [{"name": "think", "type": "agent", "model": "fast", "prompt": "hi",
                   "output_schema": {"type": "object"}}]}, actor=SETUP)
    paused = run_start(version=version, input={}, actor=SETUP)
    run_resume(run_id=paused.id, actor=operator)
    assert states(paused) == ("paused", {"think": "ready"})


def test_a_run_with_a_failed_step_is_not_resumed_until_it_is_retried_or_skipped(team, operator):
    run = start(team)
    finish(run, "call", error=BOOM)
    with pytest.raises(NotAllowed, match="retry or skip"):
        run_resume(run_id=run.id, actor=operator)
    assert states(run)[0] == "paused"


@pytest.mark.parametrize("state", ["running", "completed", "failed"])
def test_only_a_paused_run_can_be_resumed(team, operator, state):
    run = start(team)
    if state != "running":
        finish(run, "call", error=None if state == "completed" else BOOM)
        if state == "completed":
            finish(run, "after")
        else:
            Run.objects.filter(pk=run.pk).update(state="failed")
    with pytest.raises(NotAllowed, match="not paused"):
        run_resume(run_id=run.id, actor=operator)
    assert states(run)[0] == state
