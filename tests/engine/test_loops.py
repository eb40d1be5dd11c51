"""Loop steps (docs/definitions.md, "Loops"): a body run once per iteration until `until` holds,
at most `max_iterations` times, each iteration's body steps step runs of their own (`draft[2]`).

The semantics table, and every guarantee an iteration keeps: retries, a crash recovered by the
reaper, cancel, the loop's own timeout, the budget checked before each iteration, and
idempotency keys that carry the iteration. Runs are driven in this process through the services
a worker and the reaper call; the test transaction never commits, so no message is consumed.
"""
from decimal import Decimal

import pytest

from audit.models import AuditEntry
from orchestrator.engine.retry import StepError
from orchestrator.engine.services import reaper
from orchestrator.engine.services.kinds.worker import (
    Usage,
    step_claim,
    step_execute,
    step_fail,
    step_retry_due,
    step_succeed,
)
from orchestrator.engine.services.runs import run_cancel, run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Effect, Run, StepRun
from tests.factories import SETUP

pytestmark = pytest.mark.django_db


def loop(max_iterations=3, *, draft=None, **extra):
    return {
        "name": "refine", "type": "loop", "max_iterations": max_iterations,
        "input": {"topic": "{{ input.topic }}"},
        "until": "steps.critique.output.approved == true",
        "body": [
            {"name": "draft", "type": "tool", "tool": "core.echo",
             "params": {"topic": "{{ iteration.input.topic }}", "round": "{{ iteration.number }}"},
             **(draft or {})},
            {"name": "critique", "type": "tool", "tool": "core.echo", "after": ["draft"]},
        ],
        **extra,
    }


def start(team, *steps, **definition) -> Run:
    version, _ = workflow_save(team=team, definition={
        "name": "looped", "input_schema": {"type": "object"},
        "steps": list(steps) or [loop(), {"name": "publish", "type": "tool", "tool": "core.echo",
                                          "after": ["refine"]}],
        **definition}, actor=SETUP)
    return run_start(version=version, input={"topic": "tides"}, actor=SETUP)


def finish(run: Run, name: str, output=None, *, error: StepError | None = None, cost="0") -> None:
    """What a worker does with a queued step: claim it, then succeed or fail it."""
    step = run.steps.get(name=name)
    assert step.state == "queued", (name, step.state)
    claim = step_claim(step_id=step.id, worker="test")
    usage = Usage(cost_usd=Decimal(cost))
    if error:
        step_fail(step_id=step.id, attempt=claim.attempt, error=error, usage=usage, worker="test")
    else:
        step_succeed(step_id=step.id, attempt=claim.attempt, output=output or {}, usage=usage,
                     worker="test")


def iterate(run: Run, number: int, approved: bool) -> None:
    finish(run, f"draft[{number}]", {"text": f"draft {number}"})
    finish(run, f"critique[{number}]", {"approved": approved})


def states(run: Run) -> dict[str, str]:
    return dict(StepRun.objects.filter(run=run).values_list("name", "state"))


# --- the semantics table --------------------------------------------------------------------


@pytest.mark.parametrize(("max_iterations", "verdicts", "loop_state", "run_state"), [
    (1, [True], "completed", "running"),  # the condition true on the first pass: one iteration
    (3, [True], "completed", "running"),
    (3, [False, True], "completed", "running"),
    (3, [False, False, True], "completed", "running"),  # true on the last allowed pass
    (1, [False], "failed", "failed"),  # one iteration allowed, not approved: exhausted
    (3, [False, False, False], "failed", "failed"),  # max_iterations reached: loop_exhausted
])
def test_a_loop_runs_until_its_condition_holds_at_most_max_iterations_times(
        team, max_iterations, verdicts, loop_state, run_state):
    run = start(team, loop(max_iterations),
                {"name": "publish", "type": "tool", "tool": "core.echo", "after": ["refine"]})
    assert states(run) == {"refine": "waiting", "draft[1]": "queued", "critique[1]": "blocked",
                           "publish": "blocked"}

    for number, approved in enumerate(verdicts, start=1):
        iterate(run, number, approved)

    refine = run.steps.get(name="refine")
    assert refine.state == loop_state
    made = sorted(n for n in states(run) if "[" in n)
    assert made == sorted(f"{b}[{i}]" for b in ("draft", "critique") for i in range(1, len(verdicts) + 1))
    if loop_state == "completed":
        assert refine.output == {"iterations": len(verdicts),
                                 "last": {"draft": {"text": f"draft {len(verdicts)}"},
                                          "critique": {"approved": True}}}
        assert states(run)["publish"] == "queued"  # what follows the loop starts
    else:
        assert refine.error["class"] == "loop_exhausted", refine.error
        assert refine.error["iterations"] == max_iterations
        assert states(run)["publish"] == "cancelled"
    assert Run.objects.get(pk=run.pk).state == run_state


def test_an_iteration_reads_its_number_the_loop_input_and_the_previous_iteration(team):
    run = start(team)
    assert run.steps.get(name="draft[1]").input["iteration"] == {
        "number": 1, "input": {"topic": "tides"}, "previous": {}}
    iterate(run, 1, approved=False)

    second = run.steps.get(name="draft[2]").input["iteration"]
    assert second["number"] == 2
    assert second["previous"]["critique"] == {"state": "completed", "output": {"approved": False}}
    critique = run.steps.get(name="critique[2]")
    assert critique.state == "blocked"  # its `after` is this iteration's draft, not the last one's


def test_each_iteration_is_in_the_audit_timeline(team):
    run = start(team)
    iterate(run, 1, approved=False)
    iterate(run, 2, approved=True)

    actions = list(AuditEntry.objects.filter(run_id=run.id).values_list("action", "step_name"))
    assert ("step.iteration_started", "refine") in actions
    assert ("step.completed", "draft[2]") in actions and ("step.completed", "critique[1]") in actions


# --- failures inside an iteration -----------------------------------------------------------


def test_a_failed_iteration_step_is_retried_under_its_policy_and_the_loop_goes_on(team, move_clock):
    run = start(team, loop(draft={"retry": {"max_attempts": 2, "base_s": 1, "jitter": False}}))
    iterate(run, 1, approved=False)
    finish(run, "draft[2]", error=StepError("transient", "flaky"))
    assert run.steps.get(name="draft[2]").state == "retrying"

    move_clock(5)
    assert step_retry_due(step_id=run.steps.get(name="draft[2]").id)
    finish(run, "draft[2]", {"text": "second try"})
    finish(run, "critique[2]", {"approved": True})

    refine = run.steps.get(name="refine")
    assert refine.state == "completed" and refine.output["last"]["draft"] == {"text": "second try"}
    assert run.steps.get(name="draft[2]").attempts == 2


def test_an_iteration_step_that_fails_for_good_fails_the_loop_and_stops_the_iteration(team):
    run = start(team)
    finish(run, "draft[1]", error=StepError("permanent", "no"))

    refine = run.steps.get(name="refine")
    assert (refine.state, refine.error["class"], refine.error["step"]) == ("failed", "iteration_failed", "draft[1]")
    assert states(run)["critique[1]"] == "cancelled"
    assert Run.objects.get(pk=run.pk).state == "failed"


def test_a_crash_inside_an_iteration_is_recovered_by_the_reaper(team, move_clock):
    run = start(team)
    iterate(run, 1, approved=False)
    draft = run.steps.get(name="draft[2]")
    step_claim(step_id=draft.id, worker="died")  # ... and the worker dies holding the lease

    move_clock(120)
    assert reaper.reap()["leases"] == 1
    draft.refresh_from_db()
    assert draft.state in ("retrying", "queued")
    if draft.state == "retrying":
        move_clock(600)
        reaper.reap()
    finish(run, "draft[2]", {"text": "after the crash"})
    finish(run, "critique[2]", {"approved": True})

    refine = run.steps.get(name="refine")
    assert refine.state == "completed" and refine.output["iterations"] == 2
    assert list(run.steps.get(name="draft[2]").attempt_records.values_list("outcome", flat=True)) == [
        "lost", "succeeded"]


# --- cancel and the loop's own end ----------------------------------------------------------


def test_cancelling_a_run_inside_a_loop_stops_the_iteration(team):
    run = start(team)
    iterate(run, 1, approved=False)
    claim = step_claim(step_id=run.steps.get(name="draft[2]").id, worker="test")

    run_cancel(run_id=run.id, actor=SETUP)
    assert states(run)["critique[2]"] == "cancelled" and states(run)["refine"] == "cancelled"
    assert Run.objects.get(pk=run.pk).state == "cancelling"  # draft[2] is still running

    step_succeed(step_id=run.steps.get(name="draft[2]").id, attempt=claim.attempt, output={},
                 usage=Usage(), worker="test")
    assert Run.objects.get(pk=run.pk).state == "cancelled"
    assert "draft[3]" not in states(run)


def test_a_loop_past_its_timeout_stops_its_iteration_and_the_run_goes_on_its_error_policy(team, move_clock):
    run = start(team, loop(timeout_s=60), {"name": "other", "type": "tool", "tool": "core.echo"},
                on_error="continue")
    finish(run, "draft[1]", {"text": "slow"})

    move_clock(61)
    reaper.reap()
    assert states(run)["refine"] == "timed_out"
    assert states(run)["critique[1]"] == "cancelled"
    finish(run, "other")
    assert Run.objects.get(pk=run.pk).state == "completed"


# --- budget and idempotency -----------------------------------------------------------------


def test_the_budget_is_checked_before_each_iteration(team, settings):
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"
    body_agent = {"type": "agent", "model": "fast", "prompt": "p",
                  "output_schema": {"type": "object"}}
    definition = loop(draft=body_agent)
    definition["body"][0].pop("tool"), definition["body"][0].pop("params")
    run = start(team, definition, budget={"max_cost_usd": 1.0})
    finish(run, "draft[1]", {"text": "costly"}, cost="0.95")
    finish(run, "critique[1]", {"approved": False})

    refine = run.steps.get(name="refine")
    assert refine.state == "failed", (refine.state, states(run), Run.objects.get(pk=run.pk).state)
    assert (refine.error["class"], refine.error["iteration"]) == ("budget", 2)
    assert refine.cost_usd == Decimal("0.95")  # what its iterations spent, shown on the loop
    assert "draft[2]" not in states(run)


def test_an_effect_inside_a_loop_is_keyed_by_its_iteration(team):
    run = start(team, loop(draft={"side_effect": True}))
    for number, approved in ((1, False), (2, True)):
        step_execute(step_id=run.steps.get(name=f"draft[{number}]").id, worker="test")
        finish(run, f"critique[{number}]", {"approved": approved})

    keys = set(Effect.objects.filter(run=run).values_list("key", flat=True))
    assert keys == {f"{run.id}:draft[1]:default", f"{run.id}:draft[2]:default"}
    assert run.steps.get(name="refine").state == "completed"


def test_a_loop_reopened_with_its_failed_run_goes_on_with_its_iteration(team, operator):
    from orchestrator.engine.services.operators import step_retry

    run = start(team, loop(), {"name": "other", "type": "tool", "tool": "core.echo"})
    iterate(run, 1, approved=False)
    finish(run, "other", error=StepError("permanent", "down"))
    assert Run.objects.get(pk=run.pk).state == "failed"
    assert states(run)["refine"] == "cancelled" and states(run)["draft[2]"] == "cancelled"

    step_retry(step_id=run.steps.get(name="other").id, actor=operator)
    finish(run, "other")
    assert states(run)["refine"] == "waiting" and states(run)["draft[2]"] == "queued"
    assert "draft[3]" not in states(run)
    iterate(run, 2, approved=True)
    assert Run.objects.get(pk=run.pk).state == "completed"
    assert run.steps.get(name="refine").output["iterations"] == 2
