"""The evaluation capacity class (`Run.capacity`): an evaluation run's work goes to queues of its
own (`<queue>.evaluation`), which each worker family consumes after its own; it is neither
admitted against nor counted in a team's or workflow's caps and spend (only its own budget
holds it); and its end is told to the evaluation app through `events.run_ended`, once, after
commit — never an interactive run's.

Messages are read as they are sent (`current_app.send_task` and the chord recorded); runs are
driven in this process as workers would.
"""
from decimal import Decimal
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from budgets.models import Reservation
from budgets.services import budget_limit_create
from orchestrator.engine.errors import BudgetExceeded
from orchestrator.engine.events import run_ended
from orchestrator.engine.retry import StepError
from orchestrator.engine.services.kinds.worker import Usage, step_claim, step_execute, step_fail
from orchestrator.engine.services.runs import run_cancel, run_start, run_time_out
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.management.commands.stepwise_queues import queues
from orchestrator.models import Run, StepRun
from orchestrator.operations.queues import known_queues
from tests.factories import SETUP

pytestmark = pytest.mark.django_db

ECHO = {"name": "echo", "type": "tool", "tool": "core.echo", "retry": {"max_attempts": 1}}
# Fails: its output lacks what its schema requires (never retried: one attempt).
BROKEN = {**ECHO, "output_schema": {"type": "object", "required": ["never"]}}
THINK = {"name": "think", "type": "agent", "model": "fast", "prompt": "hi",
         "output_schema": {"type": "object"}}


def save(team, *steps, name="capacity", **definition):
    version, _ = workflow_save(team=team, definition={
        "name": name, "input_schema": {"type": "object"}, "steps": list(steps), **definition},
        actor=SETUP)
    return version


# --- queues -----------------------------------------------------------------------------------


@pytest.mark.parametrize("capacity, tools, agent", [
    ("interactive", "tools", "agent.fast"),
    ("evaluation", "tools.evaluation", "agent.fast.evaluation"),
])
def test_a_run_s_steps_are_sent_to_its_capacity_s_queues(team, sent, capacity, tools, agent,
                                                         django_capture_on_commit_callbacks):
    version = save(team, ECHO, {**THINK, "name": "think"})
    with django_capture_on_commit_callbacks(execute=True):
        run = run_start(version=version, input={}, actor=SETUP, capacity=capacity)

    queued = {s.name: s.queue for s in StepRun.objects.filter(run=run)}
    assert queued == {"echo": tools, "think": agent}
    assert sorted(sent) == sorted([("execute_step", tools), ("execute_step", agent)])


def test_an_evaluation_run_s_retry_and_its_reaper_redispatch_stay_on_its_queue(team, sent, move_clock,
                                                                             django_capture_on_commit_callbacks):
    from orchestrator.engine.services.kinds.worker import step_redispatch, step_retry_due

    version = save(team, {**ECHO, "retry": {"max_attempts": 2, "base_s": 1, "max_s": 1,
                                            "jitter": False, "retry_on": ["transient"]}})
    run = run_start(version=version, input={}, actor=SETUP, capacity="evaluation")
    step = StepRun.objects.get(run=run)
    claim = step_claim(step_id=step.id, worker="test")
    step_fail(step_id=step.id, attempt=claim.attempt, error=StepError("transient", "flaky"),
              usage=Usage(), worker="test")
    move_clock(2)
    with django_capture_on_commit_callbacks(execute=True):
        assert step_retry_due(step_id=step.id)
    with django_capture_on_commit_callbacks(execute=True):
        assert step_redispatch(step_id=step.id)

    assert [m for m in sent if m[0] == "execute_step"] == [("execute_step", "tools.evaluation")] * 2


def test_an_evaluation_run_s_map_items_go_to_the_evaluation_side_not_the_batch_side(
        team, sent, django_capture_on_commit_callbacks):
    each = {"name": "each", "type": "map", "over": "input.items",
            "item": {"type": "tool", "tool": "core.echo"}}
    version = save(team, each)
    with django_capture_on_commit_callbacks(execute=True):
        run_start(version=version, input={"items": [1, 2]}, actor=SETUP)
        run_start(version=version, input={"items": [1]}, actor=SETUP, capacity="evaluation")

    assert sorted(sent) == sorted([("map_item", "tools.batch")] * 2 + [("map_join", "orchestrator")]
                                  + [("map_item", "tools.evaluation"), ("map_join", "orchestrator")])


def test_an_evaluation_run_s_compensation_goes_to_the_tools_evaluation_queue(
        team, sent, django_capture_on_commit_callbacks):
    paid = {**ECHO, "name": "pay", "side_effect": True, "compensate": {"tool": "core.echo"}}
    broken = {**BROKEN, "name": "ship", "after": ["pay"]}
    run = run_start(version=save(team, paid, broken), input={}, actor=SETUP, capacity="evaluation")

    with django_capture_on_commit_callbacks(execute=True):
        run = drive(drive(run))

    assert run.state == "compensating"
    assert ("compensate_run", "tools.evaluation") in sent
    assert not [m for m in sent if m[1] in ("tools", "orchestrator") and m[0] != "child_finished"]


def test_every_family_consumes_its_evaluation_queue_after_its_own(settings):
    settings.STEPWISE_MODELS = {"fast": {}, "deep": {}}

    assert queues("orchestrator") == ["orchestrator", "orchestrator.evaluation"]
    assert queues("tools") == ["tools", "tools.batch", "tools.evaluation"]
    assert queues("agent") == ["agent.fast", "agent.deep", "agent.fast.batch", "agent.deep.batch",
                               "agent.fast.evaluation", "agent.deep.evaluation"]
    assert queues("evaluation") == ["orchestrator.evaluation", "tools.evaluation",
                                    "agent.fast.evaluation", "agent.deep.evaluation"]
    assert set(queues("evaluation")) <= set(queues("all"))
    assert set(queues("evaluation")) <= set(known_queues())  # the operations page's depths


def test_live_workers_beside_an_evaluation_worker_leave_the_evaluation_side_out(settings):
    """The Procfile's families are started `--without-evaluation` beside a worker of the
    `evaluation` family: between them every queue is consumed, each by one of them."""
    settings.STEPWISE_MODELS = {"fast": {}, "deep": {}}

    assert queues("orchestrator", with_evaluation=False) == ["orchestrator"]
    assert queues("tools", with_evaluation=False) == ["tools", "tools.batch"]
    assert queues("agent", with_evaluation=False) == ["agent.fast", "agent.deep", "agent.fast.batch",
                                                      "agent.deep.batch"]
    live = [q for family in ("orchestrator", "tools", "agent") for q in queues(family, with_evaluation=False)]
    assert sorted(live + queues("evaluation")) == sorted(queues("all"))
    assert not set(live) & set(queues("evaluation"))
    assert queues("evaluation", with_evaluation=False) == queues("evaluation")


def test_the_procfile_consumes_every_queue_once_and_the_evaluation_side_on_a_worker_of_its_own():
    import re

    procfile = (Path(__file__).resolve().parents[2] / "Procfile").read_text()
    consumed = {}
    for name, family, without in re.findall(r"^(\w+): .*stepwise_queues (\S+?)( --without-evaluation)?\)",
                                            procfile, re.MULTILINE):
        for queue in queues(family, with_evaluation=not without):
            consumed.setdefault(queue, []).append(name)
    assert set(consumed) == set(queues("all"))
    assert all(len(names) == 1 for names in consumed.values()), consumed
    assert {consumed[queue][0] for queue in queues("evaluation")} == {"evaluation"}


def test_the_test_workers_consume_every_evaluation_queue():
    from tests.integration.conftest import QUEUES

    assert set(queues("evaluation")) <= set(QUEUES.split(","))


# --- admission and spend ----------------------------------------------------------------------


def test_evaluation_runs_neither_take_nor_are_refused_a_team_s_last_slot(team):
    version = save(team, ECHO)
    budget_limit_create(team=team, actor=SETUP, max_concurrent_runs=1)
    evaluations = [run_start(version=version, input={}, actor=SETUP, capacity="evaluation")
                   for _ in range(3)]

    live = run_start(version=version, input={}, actor=SETUP)  # the slot is still free

    with pytest.raises(BudgetExceeded, match="1 unfinished runs; its limit is 1"):
        run_start(version=version, input={}, actor=SETUP)
    assert run_start(version=version, input={}, actor=SETUP, capacity="evaluation").state == "running"
    assert all(r.state == "running" for r in [*evaluations, live])


def test_a_workflow_cap_leaves_evaluation_runs_out_too(team):
    version = save(team, ECHO)
    budget_limit_create(team=team, workflow=version.workflow, actor=SETUP, max_concurrent_runs=1)
    run_start(version=version, input={}, actor=SETUP, capacity="evaluation")
    run_start(version=version, input={}, actor=SETUP)
    with pytest.raises(BudgetExceeded, match="workflow 'capacity'"):
        run_start(version=version, input={}, actor=SETUP)


def test_evaluation_spend_is_not_counted_by_nor_checked_against_the_team_s_day(team):
    version = save(team, THINK)
    budget_limit_create(team=team, actor=SETUP, daily_usd=Decimal("0.05"))
    default = Decimal(django_settings.STEPWISE_DEFAULT_STEP_COST_USD)
    assert default > Decimal("0.05")  # one live call's estimate is past the day's limit

    evaluation = run_start(version=version, input={}, actor=SETUP, capacity="evaluation")
    reserved = Reservation.objects.get(run=evaluation)
    assert reserved.levels == [] and reserved.amount == default  # held to its own levels only

    live = Run.objects.get(pk=run_start(version=version, input={}, actor=SETUP).pk)
    assert live.state == "paused" and live.error["level"] == "team.day"
    assert live.error["committed_usd"] == "0.000000"  # the evaluation's reservation not counted


def test_an_evaluation_run_keeps_its_own_budget(team):
    version = save(team, THINK, budget={"max_cost_usd": 0.01})

    run = Run.objects.get(pk=run_start(version=version, input={}, actor=SETUP,
                                       capacity="evaluation").pk)

    assert run.state == "paused" and run.error["level"] == "run"


# --- the end of an evaluation run ---------------------------------------------------------------


@pytest.fixture
def ended():
    seen = []

    def receiver(sender, run, **kwargs):
        seen.append((run.id, run.state))

    run_ended.connect(receiver)
    yield seen
    run_ended.disconnect(receiver)


def drive(run: Run) -> Run:
    for step_id in StepRun.objects.filter(run=run, state="queued").values_list("id", flat=True):
        step_execute(step_id=step_id, worker="test")
    return Run.objects.get(pk=run.pk)


@pytest.mark.parametrize("step, state", [
    (ECHO, "completed"),
    (BROKEN, "failed"),
])
def test_run_ended_is_sent_once_after_commit_when_an_evaluation_run_ends(
        team, ended, sent, django_capture_on_commit_callbacks, step, state):
    version = save(team, step)
    run = run_start(version=version, input={}, actor=SETUP, capacity="evaluation")

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        run = drive(run)
    assert run.state == state and ended == []  # not before the commit
    for callback in callbacks:
        callback()

    assert ended == [(run.id, state)]


def test_run_ended_is_sent_for_a_cancelled_and_a_timed_out_evaluation_run(
        team, ended, sent, move_clock, django_capture_on_commit_callbacks):
    version = save(team, ECHO, budget={"max_duration_s": 60, "on_duration": "fail"})
    cancelled = run_start(version=version, input={}, actor=SETUP, capacity="evaluation")
    late = run_start(version=version, input={}, actor=SETUP, capacity="evaluation")

    with django_capture_on_commit_callbacks(execute=True):
        run_cancel(run_id=cancelled.id, actor=SETUP)
    move_clock(61)
    with django_capture_on_commit_callbacks(execute=True):
        assert run_time_out(run_id=late.id)

    assert ended == [(cancelled.id, "cancelled"), (late.id, "timed_out")]


def test_run_ended_is_not_sent_for_an_interactive_run(team, ended, sent,
                                                      django_capture_on_commit_callbacks):
    run = run_start(version=save(team, ECHO), input={}, actor=SETUP)

    with django_capture_on_commit_callbacks(execute=True):
        assert drive(run).state == "completed"

    assert ended == []


def test_a_receiver_that_raises_stops_neither_the_others_nor_the_engine(
        team, ended, sent, django_capture_on_commit_callbacks):
    def broken(sender, run, **kwargs):
        raise RuntimeError("the evaluation app failed")

    run_ended.connect(broken)
    try:
        run = run_start(version=save(team, ECHO), input={}, actor=SETUP, capacity="evaluation")
        with django_capture_on_commit_callbacks(execute=True):
            run = drive(run)
    finally:
        run_ended.disconnect(broken)

    assert ended == [(run.id, "completed")]
