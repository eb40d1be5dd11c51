"""A repair turn is a model call of its own for budgets: reserved against every level before it
is sent, settled to what it cost after, and not sent at all when it would cross a limit.

The model is a real local HTTP server speaking the OpenAI API (tests/support/fake_llm.py); the
step is run in this process by the worker's own service (`step_execute`), so the reservation
and the pause go through the same code a worker runs. Each reply costs $0.07 (7 output tokens
at $10,000 per million); a call with no history is estimated at the default, $0.10.
"""
from decimal import Decimal

import pytest

from budgets.models import BudgetAlert, Reservation
from orchestrator.engine.services.kinds.worker import step_retry_due
from orchestrator.engine.services.operators import run_budget_raise
from orchestrator.models import Run
from tests.support.fake_llm import reply, text

from .conftest import CALL, ESTIMATE, classify_run, execute

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("priced_model")]
VALID = {"category": "billing"}


def calls(run: Run) -> list[tuple]:
    return list(Reservation.objects.filter(run=run).order_by("attempt", "turn").values_list(
        "attempt", "turn", "state", "amount", "actual"))


def test_each_repair_turn_reserves_before_its_call_and_is_settled_to_what_it_cost(team, fake_llm):
    fake_llm.then(text("billing, I think"), reply(VALID))
    run = classify_run(team, budget=1.0)
    assert calls(run) == [(1, 0, "reserved", ESTIMATE, None)]

    execute(run)

    run.refresh_from_db()
    assert (run.state, run.output) == ("completed", {"classify": VALID})
    assert len(fake_llm.requests) == 2
    assert calls(run) == [(1, 0, "settled", ESTIMATE, CALL), (1, 1, "settled", ESTIMATE, CALL)]
    assert run.cost_usd == 2 * CALL
    turn = Reservation.objects.get(run=run, turn=1)
    assert turn.levels == ["run"] and turn.model == "gpt"


def test_a_repair_turn_that_would_cross_the_limit_pauses_the_run_before_the_call(
        team, fake_llm, operator):
    # 0.07 spent on the first call + 0.10 projected for the repair > 0.15.
    fake_llm.then(text("billing, I think"))
    run = classify_run(team, budget=0.15)

    execute(run)

    assert len(fake_llm.requests) == 1  # the repair was never sent
    run.refresh_from_db()
    assert run.state == "paused"
    assert run.error == {
        "class": "budget", "level": "run", "step": "classify", "limit_usd": "0.150000",
        "committed_usd": "0.070000", "projected_usd": "0.100000",
        "message": "run budget: $0.0700 committed + $0.1000 projected for step 'classify' "
                   "would exceed the limit of $0.15"}
    assert calls(run) == [(1, 0, "settled", ESTIMATE, CALL)]  # nothing reserved for the turn
    assert run.cost_usd == CALL  # the call that was made is charged
    step = run.steps.get(name="classify")
    assert (step.state, step.error["class"]) == ("retrying", "budget")
    assert list(step.attempt_records.values_list("outcome", "error_class", "cost_usd")) == [
        ("failed", "budget", CALL)]
    assert BudgetAlert.objects.filter(kind="budget.denied", key__startswith=f"run:{run.id}:run:").exists()

    # An operator raises the limit; the run resumes and the held step runs a new attempt.
    run_budget_raise(run_id=run.id, max_cost_usd=Decimal("1.00"), reason="worth it", actor=operator)
    assert step_retry_due(step_id=step.id)
    fake_llm.then(reply(VALID))
    execute(run)

    run.refresh_from_db()
    assert run.state == "completed"
    assert len(fake_llm.requests) == 2
    assert calls(run) == [(1, 0, "settled", ESTIMATE, CALL), (2, 0, "settled", ESTIMATE, CALL)]


def test_a_map_items_repair_turn_reserves_too_and_pauses_the_run_before_a_call_that_would_cross(
        team, fake_llm, operator):
    from orchestrator.engine.services import reaper
    from orchestrator.engine.services.kinds.map_step import map_item_run
    from orchestrator.engine.services.runs import run_start
    from orchestrator.engine.services.workflows import workflow_save
    from orchestrator.models import MapItem
    from tests.factories import SETUP

    body = {"type": "agent", "model": "gpt", "prompt": "Classify: {{ item }}", "repair_attempts": 1,
            "output_schema": {"type": "object", "required": ["category"],
                              "properties": {"category": {"enum": ["billing", "technical"]}}}}
    version, _ = workflow_save(team=team, definition={
        "name": "each", "input_schema": {"type": "object"}, "budget": {"max_cost_usd": 0.15},
        "steps": [{"name": "each", "type": "map", "over": "input.tickets", "item": body}]}, actor=SETUP)
    run = run_start(version=version, input={"tickets": ["my invoice"]}, actor=SETUP)
    step = run.steps.get(name="each")
    fake_llm.then(text("billing, I think"))

    map_item_run(step_id=step.id, index=0)

    assert len(fake_llm.requests) == 1  # the repair was never sent
    run.refresh_from_db()
    assert (run.state, run.error["level"], run.error["projected_usd"]) == ("paused", "run", "0.100000")
    item = MapItem.objects.get(step=step)
    assert (item.done, item.lease_expires_at, item.error["class"]) == (False, None, "budget")
    assert item.cost_usd == CALL
    assert calls(run) == [(1, 0, "settled", ESTIMATE, CALL)]

    run_budget_raise(run_id=run.id, max_cost_usd=Decimal("1.00"), reason="worth it", actor=operator)
    fake_llm.then(reply(VALID))
    map_item_run(step_id=step.id, index=0)  # what the reaper's resent message runs
    reaper.reap()  # joins the map

    run.refresh_from_db()
    assert run.state == "completed"
    assert len(fake_llm.requests) == 2
    assert calls(run) == [(1, 0, "settled", ESTIMATE, CALL), (2, 0, "settled", ESTIMATE, CALL)]


@pytest.mark.parametrize("claimed", [False, True])
def test_a_repair_turn_of_an_attempt_that_no_longer_holds_its_step_is_refused_as_lost(team, claimed):
    """A worker whose attempt was superseded (its step not running, or running under a newer
    attempt) asks for a repair turn: the call is refused as `lost` and nothing is reserved."""
    from orchestrator.engine.retry import StepError
    from orchestrator.engine.services.kinds.agent import repair_reserve
    from orchestrator.engine.services.kinds.worker import step_claim

    run = classify_run(team, budget=1.0)
    step = run.steps.get(name="classify")
    if claimed:
        step_claim(step_id=step.id, worker="newer")  # attempt 1 holds it; attempt 0 is stale
    with pytest.raises(StepError) as refused:
        repair_reserve(1, step_id=step.id, attempt=0 if claimed else 1)
    assert (refused.value.error_class, refused.value.message) == (
        "lost", "the attempt no longer holds its step")
    assert not Reservation.objects.filter(run=run, turn=1).exists()
