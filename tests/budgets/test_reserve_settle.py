"""What one dispatch reserves, what settling an attempt charges to each of its calls, and what
releasing a step frees (`budget_reserve`, `budget_settle`, `budget_release`).

- A step is estimated from its own succeeded attempts in its workflow, not from the model's
  average elsewhere; a map with a cap of its own still reserves each item at that estimate; a
  retry reserves what is left of its step's cap, and a spent cap pauses the run naming the step.
- A reservation is dated the moment it was checked against the limits, even if the clock moves
  on before it is written.
- Settling a whole attempt charges its last open call with what its settled turns do not account
  for, and every earlier open call nothing, all settled at the same moment.
- Releasing frees the open calls of that step only (of one attempt, when asked), dated now.

Driven through the services a dispatch and a worker call, on the engine's clock.
"""
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from budgets.models import Reservation
from budgets.services import budget_release, budget_reserve, budget_settle
from orchestrator.engine import clock
from orchestrator.engine.selectors import definition_of, lock_run
from orchestrator.engine.services.kinds.worker import step_retry_due
from orchestrator.models import Run
from tests.budgets.test_levels import another_call, calls
from tests.budgets.test_reservations import (
    TRANSIENT,
    agent,
    reservations,
    spend,
    start,
    states,
    usd,
)

pytestmark = pytest.mark.django_db
RETRY = {"max_attempts": 3, "base_s": 1, "max_s": 1, "jitter": False}


@pytest.fixture
def estimate(settings):
    """Every model call with no history is estimated at $0.10."""
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"


# --- what a dispatch reserves ----------------------------------------------------------------


def test_a_step_is_reserved_at_its_own_average_in_its_workflow_not_the_models(team, estimate):
    spend(start(team, [agent("a")], name="plan"), "a", "0.30")
    spend(start(team, [agent("a")], name="other"), "a", "0.90")  # the same step name and model elsewhere

    run = start(team, [agent("a")], name="plan")

    # The model's average over both would be 0.60.
    assert reservations(run) == [("a", 1, -1, "reserved", Decimal("0.30"), None)]


def test_a_map_with_its_own_cap_reserves_each_item_at_its_estimate(team, estimate):
    each = {"name": "each", "type": "map", "over": "input.items", "max_cost_usd": 0.5,
            "item": {"type": "agent", "model": "fast", "prompt": "{{ item }}", "output_schema": {"type": "object"}}}

    run = start(team, [each], input_={"items": [1, 2, 3]})

    # Its cap limits the items together (0.30 of 0.50); it is not what each one is expected to cost.
    assert states(run) == ("waiting", {"each": "waiting"})
    assert reservations(run) == [("each", 1, i, "reserved", Decimal("0.10"), None) for i in range(3)]


def test_a_retry_reserves_what_is_left_of_its_steps_cap(team, estimate, move_clock):
    run = start(team, [agent("capped", max_cost_usd=0.25, retry=RETRY)])
    spend(run, "capped", "0.10", error=TRANSIENT)
    move_clock(5)

    assert step_retry_due(step_id=run.steps.get().id) is True

    assert states(run) == ("running", {"capped": "queued"})
    assert reservations(run)[1] == ("capped", 2, -1, "reserved", Decimal("0.15"), None)


def test_a_retry_of_a_step_whose_cap_is_spent_pauses_the_run_naming_the_step(team, estimate, move_clock):
    run = start(team, [agent("capped", max_cost_usd=0.25, retry=RETRY)])
    spend(run, "capped", "0.25", error=TRANSIENT)
    move_clock(5)

    assert step_retry_due(step_id=run.steps.get().id) is False

    assert Run.objects.get(pk=run.pk).error == {
        "class": "budget", "level": "step", "step": "capped", "limit_usd": usd("0.25"),
        "committed_usd": usd("0.25"), "projected_usd": usd("0"),
        "message": "step budget: $0.2500 committed + $0.0000 projected for step 'capped' "
                   "would exceed the limit of $0.25"}


def test_a_reservation_is_dated_when_it_was_checked_even_if_the_clock_moves_on(team, estimate, monkeypatch):
    run = start(team, [agent("think")])
    checked = datetime(2026, 11, 3, 23, 59, 59, 999999, tzinfo=UTC)
    moments = iter([checked])
    # The first reading is the check's; every later one is past midnight.
    monkeypatch.setattr(clock, "_source", lambda: next(moments, checked + timedelta(seconds=1)))
    locked = lock_run(run.id)
    definition, graph = definition_of(locked)

    outcome = budget_reserve(run=locked, step=run.steps.get(), spec=graph.steps["think"],
                             definition=definition, attempt=2)

    assert outcome.denial is None
    assert Reservation.objects.get(run=run, attempt=2).created_at == checked


# --- settling a whole attempt ----------------------------------------------------------------


@pytest.mark.parametrize("settled_turns, open_turns, charged", [
    ({}, [0], {0: "0.10"}),
    # The settled turn's 0.03 is taken off; the call that never returned is charged nothing.
    ({0: "0.03"}, [1, 2], {1: "0", 2: "0.07"}),
    ({}, [0, 1, 2], {0: "0", 1: "0", 2: "0.10"}),  # only the last open call is charged
])
def test_an_attempt_charges_its_last_open_call_what_its_settled_turns_did_not(
        team, estimate, move_clock, settled_turns, open_turns, charged):
    run = start(team, [agent("think")])
    step_id = run.steps.get().id
    for turn in range(1, max(open_turns) + 1):
        another_call(run, attempt=1, turn=turn)
    for turn, actual in settled_turns.items():
        budget_settle(step_id=step_id, attempt=1, turn=turn, actual=Decimal(actual))
    before = calls(run)
    move_clock(30)

    budget_settle(step_id=step_id, attempt=1, actual=Decimal("0.10"))

    end = clock.now()
    assert calls(run) == {**{(1, t): before[1, t] for t in settled_turns},
                          **{(1, t): ("settled", Decimal(cost), end) for t, cost in charged.items()}}


# --- releasing -------------------------------------------------------------------------------


@pytest.mark.parametrize("attempt, freed, still_open", [
    (2, {("left", 2)}, {("left", 1), ("right", 1)}),
    (None, {("left", 1), ("left", 2)}, {("right", 1)}),
])
def test_a_release_frees_that_steps_open_calls_only_and_dates_them(team, estimate, move_clock, attempt,
                                                                     freed, still_open):
    run = start(team, [agent("left"), agent("right")])
    first = Reservation.objects.get(run=run, step__name="left")
    Reservation.objects.create(run=run, step=first.step, team=first.team, workflow=first.workflow,
                               attempt=2, model=first.model, amount=first.amount)  # a retry's call
    move_clock(30)

    released = budget_release(step_id=run.steps.get(name="left").id, attempt=attempt)

    rows = {(r.step.name, r.attempt): (r.state, r.actual, r.settled_at)
            for r in Reservation.objects.filter(run=run).select_related("step")}
    assert released == len(freed)
    assert rows == {**{call: ("released", Decimal("0"), clock.now()) for call in freed},
                    **{call: ("reserved", None, None) for call in still_open}}
