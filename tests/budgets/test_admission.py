"""Admitting a new run against a team's and a workflow's limits (`budgets.services.budget_admit`,
through `run_start` and the API), which limits are in force (`limits_in_force`), and a run's
wall-clock limit as its definition sets it and an operator raises it (`elapsed_denial`).

- A refusal names its level, its limit and what is counted against it (`BudgetExceeded.detail`),
  says it in words, and says when asking again may succeed: 30 s for a concurrent-run cap, an
  hour for a spent day or month (the API's `Retry-After`).
- The limit in force is the team's own (never another team's), the latest by `effective_from`
  (not the last recorded), not one that starts later, and the team's and the workflow's apply
  together. Limits and periods are read at one moment: a limit ending during an admission still
  applies to it.
- A run's duration limit is the latest of its own overrides that sets a duration (by the clock,
  a cost-only raise leaving it be), else its definition's; another run's raise changes nothing.
"""
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from budgets.models import BudgetOverride
from budgets.services import budget_admit, budget_limit_create, elapsed_denial
from orchestrator.engine import clock
from orchestrator.engine.errors import BudgetExceeded
from orchestrator.engine.selectors import definition_of
from orchestrator.engine.services.operators import run_budget_raise
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Run
from tests.budgets.test_reservations import agent
from tests.factories import SETUP, TeamFactory

pytestmark = pytest.mark.django_db
NOON = datetime(2026, 11, 3, 12, tzinfo=UTC)


@pytest.fixture
def at(monkeypatch, settings):
    """Set the engine's clock: `at(datetime)`; it starts at NOON. Every call with no history is
    estimated (and reserved) at $0.10."""
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"

    def move(moment: datetime) -> None:
        monkeypatch.setattr(clock, "_source", lambda: moment)

    move(NOON)
    return move


def spender(team, name: str = "spender", *, budget: dict | None = None):
    version, _ = workflow_save(team=team, actor=SETUP, definition={
        "name": name, "input_schema": {"type": "object"}, "budget": budget or {},
        "steps": [agent("think")]})
    return version


def started(version) -> Run:
    return run_start(version=version, input={}, actor=SETUP)


def refusal(version) -> BudgetExceeded:
    with pytest.raises(BudgetExceeded) as refused:
        started(version)
    return refused.value


# --- what a refusal says ---------------------------------------------------------------------


@pytest.mark.parametrize("of_workflow, limits, message, detail, retry_after_s", [
    (False, {"max_concurrent_runs": 1}, "team 'support' has 1 unfinished runs; its limit is 1",
     {"level": "team.concurrent_runs", "limit": 1, "current": 1}, 30),
    (True, {"max_concurrent_runs": 1}, "workflow 'spender' has 1 unfinished runs; its limit is 1",
     {"level": "workflow.concurrent_runs", "limit": 1, "current": 1}, 30),
    (False, {"daily_usd": Decimal("0.10")}, "team 'support' has committed $0.10 this day; its limit is $0.10",
     {"level": "team.day", "limit_usd": "0.100000", "committed_usd": "0.100000"}, 3600),
    (True, {"monthly_usd": Decimal("0.10")},
     "workflow 'spender' has committed $0.10 this month; its limit is $0.10",
     {"level": "workflow.month", "limit_usd": "0.100000", "committed_usd": "0.100000"}, 3600),
])
def test_a_refused_run_names_its_level_the_figures_and_when_to_ask_again(team, at, of_workflow, limits,
                                                                        message, detail, retry_after_s):
    version = spender(team)
    started(version)  # live, and its call reserved at $0.10
    budget_limit_create(team=team, workflow=version.workflow if of_workflow else None, actor=SETUP, **limits)

    refused = refusal(version)

    assert (str(refused), refused.detail, refused.retry_after_s) == (message, detail, retry_after_s)
    assert Run.objects.count() == 1


def test_a_spent_day_answers_429_with_retry_after_an_hour(team, at, api):
    version = spender(team)
    started(version)
    budget_limit_create(team=team, actor=SETUP, daily_usd=Decimal("0.10"))

    response = api.post("/api/v1/workflows/spender/runs/", {"input": {}}, format="json")

    assert (response.status_code, response.headers["Retry-After"]) == (429, "3600")
    assert response.json() == {"errors": [{"path": "", "message":
                                           "team 'support' has committed $0.10 this day; its limit is $0.10"}]}


# --- which limits are in force ---------------------------------------------------------------


def test_another_teams_limit_does_not_apply(team, at):
    version = spender(team)
    budget_limit_create(team=TeamFactory(slug="other", name="Other"), actor=SETUP, max_concurrent_runs=1)

    runs = [started(version) for _ in range(2)]

    assert [run.state for run in runs] == ["running", "running"]


def test_a_limit_applies_from_its_effective_from_not_before(team, at):
    version = spender(team)
    budget_limit_create(team=team, actor=SETUP, max_concurrent_runs=1, effective_from=NOON + timedelta(days=1))

    assert [started(version).state for _ in range(2)] == ["running", "running"]
    at(NOON + timedelta(days=1))
    assert str(refusal(version)) == "team 'support' has 2 unfinished runs; its limit is 1"


def test_the_limit_in_force_is_the_latest_by_effective_from_not_the_last_recorded(team, at):
    version = spender(team)
    budget_limit_create(team=team, actor=SETUP, max_concurrent_runs=1, effective_from=NOON - timedelta(hours=1))
    budget_limit_create(team=team, actor=SETUP, max_concurrent_runs=5, effective_from=NOON - timedelta(hours=2))
    started(version)

    assert str(refusal(version)) == "team 'support' has 1 unfinished runs; its limit is 1"


def test_the_workflows_cap_applies_beside_a_newer_team_limit(team, at):
    version = spender(team)
    budget_limit_create(team=team, workflow=version.workflow, actor=SETUP, max_concurrent_runs=1)
    budget_limit_create(team=team, actor=SETUP, monthly_usd=Decimal("100"))  # newer, no run cap
    started(version)

    assert str(refusal(version)) == "workflow 'spender' has 1 unfinished runs; its limit is 1"


def test_a_limit_ending_during_an_admission_still_applies_to_it(team, at, monkeypatch):
    # The admission reads the clock once: the limits and the periods are those of that moment.
    version = spender(team)
    budget_limit_create(team=team, actor=SETUP, max_concurrent_runs=1, effective_from=NOON - timedelta(hours=1),
                        effective_to=NOON + timedelta(milliseconds=1))
    started(version)
    moments = iter([NOON])  # the admission's moment; the clock has moved on by any later read
    monkeypatch.setattr(clock, "_source", lambda: next(moments, NOON + timedelta(seconds=1)))

    with pytest.raises(BudgetExceeded, match=r"^team 'support' has 1 unfinished runs; its limit is 1$"):
        budget_admit(team=team, workflow=version.workflow)


# --- a run's duration limit ------------------------------------------------------------------


def late_run(team, *, name: str = "spender") -> Run:
    return started(spender(team, name, budget={"max_duration_s": 60}))


def past_duration(run: Run, move_clock, seconds: float = 120) -> dict | None:
    move_clock(seconds)
    run = Run.objects.get(pk=run.pk)
    return elapsed_denial(run=run, definition=definition_of(run)[0], step="think")


def test_a_run_past_its_duration_is_denied_for_any_step_without_naming_one(team, move_clock):
    run = late_run(team)
    move_clock(120)

    run = Run.objects.get(pk=run.pk)
    assert elapsed_denial(run=run, definition=definition_of(run)[0]) == {
        "class": "budget", "level": "run.duration", "step": "", "limit_s": 60, "elapsed_s": 120,
        "message": "elapsed 120s exceeds the budget of 60s"}


def test_another_runs_raised_duration_does_not_lift_this_ones(team, move_clock, operator):
    raised, other = late_run(team), late_run(team)
    run_budget_raise(run_id=raised.id, max_duration_s=3600, reason="slow but worth it", actor=operator)

    assert past_duration(other, move_clock)["limit_s"] == 60
    assert past_duration(raised, move_clock) is None


def test_a_cost_raise_after_a_duration_raise_keeps_the_raised_duration(team, move_clock, operator):
    run = late_run(team)
    run_budget_raise(run_id=run.id, max_duration_s=3600, reason="slow", actor=operator)
    run_budget_raise(run_id=run.id, max_cost_usd=Decimal("5"), reason="and dear", actor=operator)

    assert past_duration(run, move_clock) is None


def test_the_duration_override_in_force_is_the_latest_by_the_clock(team, move_clock):
    run = late_run(team)
    later = clock.now() + timedelta(seconds=10)
    BudgetOverride.objects.create(run=run, max_duration_s=3600, reason="r", actor="a", created_at=later)
    BudgetOverride.objects.create(run=run, max_duration_s=90, reason="r", actor="a",
                                  created_at=later - timedelta(seconds=5))  # made after, dated before
    Run.objects.filter(pk=run.pk).update(deadline_at=run.started_at + timedelta(seconds=3600))

    assert past_duration(run, move_clock) is None
