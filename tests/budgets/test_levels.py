"""The levels a reservation is checked against (`budgets.services._levels`), and the records
around them: which levels apply and what each counts (a team's or a workflow's day and month,
from the start of the UTC day or month; the run's limit as the operator last raised it), that
each level's warning goes out once for its own run, limit and period, how a call is settled
(per turn, or for the whole attempt), and what setting a limit or raising a run's writes to the
ledger. Driven through the services a dispatch, a worker and an operator call; the clock is the
engine's, set by the test.
"""
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from alerts.detection import alerts_scan
from alerts.models import Alert
from audit.models import AuditEntry
from budgets.models import BudgetOverride, Reservation
from budgets.services import (
    budget_limit_create,
    budget_settle,
    committed_sum,
    override_record,
    period_start,
    run_limit,
)
from orchestrator.engine import clock
from orchestrator.engine.selectors import definition_of
from orchestrator.engine.services.operators import run_budget_raise, run_resume
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Run
from tests.budgets.test_reservations import agent, start, states
from tests.factories import SETUP, TeamFactory

pytestmark = pytest.mark.django_db
NOON = datetime(2026, 11, 3, 12, tzinfo=UTC)


@pytest.fixture
def at(monkeypatch):
    """Set the engine's clock: `at(datetime)`."""
    def move(moment: datetime) -> None:
        monkeypatch.setattr(clock, "_source", lambda: moment)
    return move


@pytest.fixture
def estimate(settings):
    """Every model call with no history is estimated at $0.10."""
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"


def workflow_of(run: Run):
    return run.version.workflow


def warnings() -> set[tuple]:
    """The budget warnings raised: alert detection reads the budget gate's events first."""
    alerts_scan()
    return set(Alert.objects.filter(rule="budget.warning").values_list("run_id", "subject"))


# --- which levels apply ----------------------------------------------------------------------


@pytest.mark.parametrize("team_caps, workflow_caps, levels", [
    ({"daily_usd": 5, "monthly_usd": 50}, {"daily_usd": 5, "monthly_usd": 50},
     ["step", "run", "team.day", "team.month", "workflow.day", "workflow.month"]),
    ({"monthly_usd": 50}, {}, ["step", "run", "team.month"]),  # no day cap: the month still counts
    ({"daily_usd": 5}, {}, ["step", "run", "team.day"]),
    ({}, {"monthly_usd": 50}, ["step", "run", "workflow.month"]),
    ({}, {"daily_usd": 5}, ["step", "run", "workflow.day"]),
    ({}, {}, ["step", "run"]),
])
def test_a_reservation_records_every_level_it_was_checked_against(team, estimate, team_caps, workflow_caps,
                                                                   levels):
    version, _ = workflow_save(team=team, actor=SETUP, definition={
        "name": "spender", "input_schema": {"type": "object"}, "steps": [agent("think")]})
    if team_caps:
        budget_limit_create(team=team, actor=SETUP, **{k: Decimal(v) for k, v in team_caps.items()})
    if workflow_caps:
        budget_limit_create(team=team, workflow=version.workflow, actor=SETUP,
                            **{k: Decimal(v) for k, v in workflow_caps.items()})

    run = start(team, [agent("think", max_cost_usd=0.5)], budget=1.0)

    assert Reservation.objects.get(run=run).levels == levels


def test_a_month_counts_the_whole_month_and_a_day_only_today(team, estimate, at):
    at(datetime(2026, 11, 1, 0, 0, tzinfo=UTC))  # the first moment of the month and of its first day
    first = start(team, [agent("think")])
    budget_limit_create(team=team, actor=SETUP, daily_usd=Decimal("0.15"), monthly_usd=Decimal("0.25"),
                        effective_from=datetime(2026, 11, 1, tzinfo=UTC))
    at(datetime(2026, 11, 1, 23, 59, 59, tzinfo=UTC))
    assert states(start(team, [agent("think")]))[0] == "paused"  # 0.10 today already: 0.20 > 0.15
    at(NOON)

    second = start(team, [agent("think")])  # a new day: 0.10 + 0.10 of the month's 0.25
    third = start(team, [agent("think")])   # today 0.20 > 0.15

    assert states(second)[0] == "running"
    error = Run.objects.get(pk=third.pk).error
    assert (error["level"], error["committed_usd"]) == ("team.day", "0.100000")
    at(datetime(2026, 11, 4, 0, 0, tzinfo=UTC))
    fourth = start(team, [agent("think")])  # today 0 of 0.15, the month 0.20 + 0.10 > 0.25
    error = Run.objects.get(pk=fourth.pk).error
    assert (error["level"], error["committed_usd"]) == ("team.month", "0.200000")
    assert Reservation.objects.filter(run=first).exists()


def test_the_levels_are_those_at_the_moment_of_the_reservation_not_a_later_reading(team, estimate, monkeypatch):
    """A reservation checks the limits in force, and the day they count, at its own moment
    (`at`), however far the clock moves while it reads them. The clock here reads a second
    before midnight for the reservation and after midnight for anyone else: a new, generous
    limit starts at midnight, and a new day would count nothing yet."""
    monkeypatch.setattr(clock, "_source", lambda: NOON)
    start(team, [agent("think")])  # 0.10 today
    budget_limit_create(team=team, actor=SETUP, daily_usd=Decimal("0.15"),
                        effective_from=datetime(2026, 11, 3, tzinfo=UTC))
    budget_limit_create(team=team, actor=SETUP, daily_usd=Decimal("100"),
                        effective_from=datetime(2026, 11, 4, tzinfo=UTC))
    before_midnight = datetime(2026, 11, 3, 23, 59, 59, tzinfo=UTC)
    after_midnight = datetime(2026, 11, 4, 0, 0, 1, tzinfo=UTC)

    def moving() -> datetime:
        reader = sys._getframe(2).f_code.co_name  # the caller of clock.now()
        return before_midnight if reader == "budget_reserve" else after_midnight

    monkeypatch.setattr(clock, "_source", moving)
    refused = start(team, [agent("think")])

    error = Run.objects.get(pk=refused.pk).error
    assert (error["level"], error["committed_usd"]) == ("team.day", "0.100000")


def test_a_workflows_day_counts_its_own_runs_not_the_teams_other_workflows(team, estimate, at):
    at(NOON)
    mine = start(team, [agent("think")], name="mine")
    start(team, [agent("think")], name="other")
    budget_limit_create(team=team, workflow=workflow_of(mine), actor=SETUP, daily_usd=Decimal("0.15"),
                        effective_from=NOON - timedelta(hours=1))

    refused = start(team, [agent("think")], name="mine")

    error = Run.objects.get(pk=refused.pk).error
    assert (error["level"], error["committed_usd"], error["projected_usd"]) == (
        "workflow.day", "0.100000", "0.100000")


@pytest.mark.parametrize("period, moment, begins", [
    ("day", datetime(2026, 11, 15, 13, 47, 31, 123456, tzinfo=UTC), datetime(2026, 11, 15, tzinfo=UTC)),
    ("month", datetime(2026, 11, 15, 13, 47, 31, 123456, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC)),
    ("day", datetime(2026, 11, 1, 0, 0, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC)),
    ("month", datetime(2026, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)),
])
def test_a_period_begins_at_midnight_of_its_day_or_of_its_months_first_day(period, moment, begins):
    assert period_start(period, moment) == begins


# --- warnings, once per run, level, limit and period ----------------------------------------


def test_each_runs_step_and_run_warnings_go_out_for_that_run(team, estimate, operator):
    # The step's cap is its estimate (0.10 of 0.10); the run reserves 0.10 of its 0.12.
    runs = [start(team, [agent("think", max_cost_usd=0.1)], budget=0.12) for _ in range(2)]

    assert warnings() == {(run.id, f"Budget reached its warning threshold: spender ({level})")
                          for run in runs for level in ("step", "run")}


def test_a_limits_day_and_month_warn_separately(team, settings, operator, at):
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.90"
    at(NOON)
    budget_limit_create(team=team, actor=SETUP, daily_usd=Decimal("1"), monthly_usd=Decimal("1"),
                        effective_from=NOON - timedelta(hours=1))

    run = start(team, [agent("think")])

    assert warnings() == {(run.id, "Budget reached its warning threshold: spender (team.day)"),
                          (run.id, "Budget reached its warning threshold: spender (team.month)")}


def test_a_zero_limit_lets_a_free_call_go_without_a_warning(team, settings, operator):
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0"
    run = start(team, [agent("think")], budget=0)

    assert states(run) == ("running", {"think": "queued"})
    assert warnings() == set()


# --- the run's limit, as an operator raised it ----------------------------------------------


def test_a_raise_applies_to_its_own_run_only(team, estimate, operator):
    raised, other = (start(team, [agent("think")], budget=0.05) for _ in range(2))

    run_budget_raise(run_id=raised.id, max_cost_usd=Decimal("1"), reason="worth it", actor=operator)
    run_resume(run_id=other.id, actor=operator)

    assert states(raised) == ("running", {"think": "queued"})
    assert states(other) == ("paused", {"think": "ready"})


def test_a_raise_below_the_estimate_keeps_the_run_paused_at_the_raised_limit(team, estimate, operator):
    run = start(team, [agent("think")], budget=0.05)

    run_budget_raise(run_id=run.id, max_cost_usd=Decimal("0.08"), reason="a little", actor=operator)

    assert states(run) == ("paused", {"think": "ready"})
    assert Run.objects.get(pk=run.pk).error["limit_usd"] == "0.080000"


def test_raising_the_duration_alone_keeps_the_raised_cost_limit(team, estimate, operator):
    run = start(team, [agent("think")], budget=0.05)
    run_budget_raise(run_id=run.id, max_cost_usd=Decimal("1"), reason="worth it", actor=operator, resume=False)

    run_budget_raise(run_id=run.id, max_duration_s=3600, reason="and slow", actor=operator)

    assert states(run) == ("running", {"think": "queued"})


def test_the_latest_override_by_the_clock_is_in_force_and_ties_go_to_the_last_made(team, estimate):
    run = start(team, [agent("think")], budget=0.05)
    definition = definition_of(run)[0]
    later = clock.now() + timedelta(minutes=5)
    BudgetOverride.objects.create(run=run, max_cost_usd=Decimal("2"), reason="r", actor="a", created_at=later)
    BudgetOverride.objects.create(run=run, max_cost_usd=Decimal("3"), reason="r", actor="a",
                                  created_at=later - timedelta(minutes=1))  # made after, dated before
    assert run_limit(run, definition) == Decimal("2")

    BudgetOverride.objects.create(run=run, max_cost_usd=Decimal("4"), reason="r", actor="a", created_at=later)

    assert run_limit(run, definition) == Decimal("4")


def test_an_override_names_the_operator_who_made_it(team, estimate, operator):
    run = start(team, [agent("think")], budget=0.05)

    run_budget_raise(run_id=run.id, max_cost_usd=Decimal("1"), reason="worth it", actor=operator)

    override = BudgetOverride.objects.get(run=run)
    assert (override.created_by, override.actor, override.reason) == (operator, "user:operator", "worth it")


def test_recording_an_override_does_not_read_the_run_again(team, estimate):
    # The caller holds the run locked: validating its foreign key would only re-read the row.
    run = start(team, [agent("think")], budget=0.05)
    with CaptureQueriesContext(connection) as queries:
        override_record(run=run, reason="engine", actor=SETUP, max_cost_usd=Decimal("1"))
    assert [q["sql"] for q in queries if Run._meta.db_table in q["sql"]] == []
    assert BudgetOverride.objects.get(run=run).max_cost_usd == Decimal("1")


# --- settling a call -------------------------------------------------------------------------


def calls(run: Run) -> dict[tuple[int, int], tuple]:
    """(attempt, turn) -> (state, actual, settled_at) of the run's reservations."""
    return {(r.attempt, r.turn): (r.state, r.actual, r.settled_at) for r in Reservation.objects.filter(run=run)}


def another_call(run: Run, *, attempt: int, turn: int) -> None:
    """A further reservation of the run's step, as `budget_reserve` makes for a retry or a turn."""
    first = Reservation.objects.get(run=run, attempt=1, turn=0)
    Reservation.objects.create(run=run, step=first.step, team=first.team, workflow=first.workflow,
                               attempt=attempt, turn=turn, model=first.model, amount=first.amount)


def test_a_turn_is_settled_alone_once_and_the_attempt_settles_what_its_turns_did_not(team, estimate, at):
    at(NOON)
    run = start(team, [agent("think")])
    step_id = run.steps.get().id
    another_call(run, attempt=1, turn=1)
    another_call(run, attempt=1, turn=2)
    settled = NOON + timedelta(seconds=30)
    at(settled)

    budget_settle(step_id=step_id, attempt=1, turn=0, actual=Decimal("0.03"))
    assert calls(run) == {(1, 0): ("settled", Decimal("0.03"), settled),
                          (1, 1): ("reserved", None, None), (1, 2): ("reserved", None, None)}
    budget_settle(step_id=step_id, attempt=1, turn=0, actual=Decimal("0.05"))  # a replay
    assert calls(run)[1, 0] == ("settled", Decimal("0.03"), settled)

    at(settled + timedelta(seconds=30))
    budget_settle(step_id=step_id, attempt=1, actual=Decimal("0.10"))  # the whole attempt cost 0.10

    end = settled + timedelta(seconds=30)
    assert calls(run) == {(1, 0): ("settled", Decimal("0.03"), settled),
                          (1, 1): ("settled", Decimal("0"), end),        # never returned
                          (1, 2): ("settled", Decimal("0.07"), end)}     # 0.10 - 0.03


def test_settling_an_attempt_leaves_another_attempts_calls_open(team, estimate):
    run = start(team, [agent("think")])
    another_call(run, attempt=2, turn=0)

    budget_settle(step_id=run.steps.get().id, attempt=2, actual=Decimal("0.04"))

    assert {k: v[:2] for k, v in calls(run).items()} == {(1, 0): ("reserved", None),
                                                         (2, 0): ("settled", Decimal("0.04"))}


@pytest.mark.parametrize("rows, committed", [
    ([], "0"),
    ([("released", "0.10", "0")], "0"),                       # only released: nothing, not NULL
    ([("reserved", "0.10", None), ("settled", "0.10", "0.03"), ("released", "0.10", "0")], "0.13"),
    ([("settled", "0.10", "0.100001"), ("settled", "0.10", "0.200002")], "0.300003"),
])
def test_what_is_committed_is_open_amounts_and_settled_costs(team, estimate, rows, committed):
    run = start(team, [agent("think")])
    first = Reservation.objects.get(run=run)
    first.delete()
    for attempt, (state, amount, actual) in enumerate(rows, start=1):
        Reservation.objects.create(run=run, step=first.step, team=first.team, workflow=first.workflow,
                                   attempt=attempt, state=state, amount=Decimal(amount),
                                   actual=None if actual is None else Decimal(actual))

    total = committed_sum(Reservation.objects.filter(run=run))

    assert isinstance(total, Decimal) and total == Decimal(committed)


# --- limits, recorded ------------------------------------------------------------------------


def test_a_limit_with_an_unknown_field_is_refused_by_name(team):
    with pytest.raises(ValueError, match=r"^unknown fields: \['daily', 'weekly_usd'\]$"):
        budget_limit_create(team=team, actor=SETUP, weekly_usd=Decimal("1"), daily=Decimal("1"))


def test_a_limit_on_another_teams_workflow_is_refused(team):
    other = TeamFactory(slug="other", name="Other")
    version, _ = workflow_save(team=other, actor=SETUP, definition={
        "name": "theirs", "input_schema": {"type": "object"}, "steps": [agent("think")]})
    with pytest.raises(ValueError, match=r"^the workflow belongs to another team$"):
        budget_limit_create(team=team, workflow=version.workflow, actor=SETUP, daily_usd=Decimal("1"))


@pytest.mark.parametrize("of_workflow, workflow, scope", [(False, "", "team"), (True, "spender", "workflow")])
def test_a_limit_is_audited_with_its_scope_and_workflow(team, of_workflow, workflow, scope):
    version, _ = workflow_save(team=team, actor=SETUP, definition={
        "name": "spender", "input_schema": {"type": "object"}, "steps": [agent("think")]})

    row = budget_limit_create(team=team, workflow=version.workflow if of_workflow else None, actor=SETUP,
                              daily_usd=Decimal("1"))

    entry = AuditEntry.objects.get(action="budget.limit_created")
    assert (entry.subject_type, entry.subject_id, entry.outcome, entry.team, entry.workflow) == (
        "budget_limit", str(row.id), "created", "support", workflow)
    assert entry.data["scope"] == scope
