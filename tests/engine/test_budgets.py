"""Budgets, checked before every dispatch (`budgets.services`): what a call costs, what the next
attempt of a step is expected to cost, and when the projection or the elapsed time breaks the
run's budget. Every edge is a table row; the clock is the engine's, moved by the test."""
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

import pytest

from budgets.services import budget_denial, cost_of, projected_cost
from orchestrator.engine.clock import now
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import StepAttempt, StepRun
from tests.factories import SETUP


@pytest.mark.parametrize("prices, tokens_in, tokens_out, usd", [
    ({"input_usd_per_mtok": 3, "output_usd_per_mtok": 15}, 1_000_000, 0, "3"),
    ({"input_usd_per_mtok": 3, "output_usd_per_mtok": 15}, 0, 1_000_000, "15"),
    ({"input_usd_per_mtok": 0.25, "output_usd_per_mtok": 1.25}, 2000, 400, "0.001"),
    ({"input_usd_per_mtok": 3}, 1000, 1000, "0.003"),  # a missing price costs nothing
    ({}, 10**6, 10**6, "0"),
])
def test_cost_of_a_call(prices, tokens_in, tokens_out, usd):
    assert cost_of(prices, tokens_in, tokens_out) == Decimal(usd)


AGENT = {"name": "think", "type": "agent", "model": "fast"}
MAP_OF_AGENTS = {"name": "each", "type": "map", "item": {"type": "agent", "model": "fast"}}
MAP_OF_TOOLS = {"name": "each", "type": "map", "item": {"type": "tool", "tool": "core.echo"}}
TOOL = {"name": "call", "type": "tool", "tool": "http.request"}


@pytest.mark.parametrize("spec, expected", [
    (AGENT, "0.10"), (MAP_OF_AGENTS, "0.10"), (MAP_OF_TOOLS, "0"), (TOOL, "0"),
])
def test_a_step_without_history_is_projected_at_the_default_cost(db, spec, expected, settings):
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"
    assert projected_cost(spec) == Decimal(expected)


def attempt(team, model: str, cost: str, outcome: str = "succeeded") -> None:
    version, _ = workflow_save(team=team, definition={
        "name": "history", "input_schema": {"type": "object"},
        "steps": [{"name": "t", "type": "tool", "tool": "core.echo"}]}, actor=SETUP)
    step = StepRun.objects.get(run=run_start(version=version, input={}, actor=SETUP))
    number = StepAttempt.objects.filter(step=step).count() + 1
    StepAttempt.objects.create(step=step, number=number, worker="w", model=model, outcome=outcome,
                               cost_usd=Decimal(cost), idempotency_key="k")


def test_a_step_with_history_is_projected_at_the_average_of_its_models_succeeded_attempts(team):
    attempt(team, "fast", "0.02")
    attempt(team, "fast", "0.04")
    attempt(team, "fast", "9", outcome="failed")  # failures are not what a call costs
    attempt(team, "deep", "5")  # another model
    assert projected_cost(AGENT) == Decimal("0.03")
    assert projected_cost(MAP_OF_AGENTS) == Decimal("0.03")


@dataclass
class RunView:
    cost_usd: Decimal
    started_at: object


def definition(**budget) -> dict:
    return {"budget": {"max_cost_usd": None, "max_duration_s": None, **budget}}


@pytest.mark.parametrize("spent, budget, denied", [
    ("0.00", None, False),          # no cost budget
    ("0.89", 1.0, False),           # 0.89 + 0.10 = 0.99
    ("0.90", 1.0, False),           # 0.90 + 0.10 = 1.00: exactly the budget is allowed
    ("0.91", 1.0, True),            # 1.01
    ("2.00", 1.0, True),
])
def test_the_projected_cost_against_max_cost(db, settings, spent, budget, denied):
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"
    run = RunView(Decimal(spent), None)
    denial = budget_denial(run=run, definition=definition(max_cost_usd=budget), spec=AGENT)
    assert (denial is not None) is denied
    if denied:
        assert denial["class"] == "budget" and denial["step"] == "think"
        projected = Decimal(spent) + Decimal("0.10")
        assert denial["message"] == f"projected cost ${projected:.4f} exceeds the budget ${Decimal(str(budget)):.2f}"


@pytest.mark.parametrize("elapsed, denied", [(59.9, False), (60, False), (60.5, True), (600, True)])
def test_the_elapsed_time_against_max_duration(db, move_clock, elapsed, denied):
    run = RunView(Decimal("0"), now() - timedelta(seconds=elapsed))
    denial = budget_denial(run=run, definition=definition(max_duration_s=60), spec=TOOL)
    assert (denial is not None) is denied
    if denied:
        assert denial == {"class": "budget", "step": "call",
                          "message": f"elapsed {elapsed:.0f}s exceeds the budget of 60s"}


def test_a_run_not_started_has_spent_no_time(db):
    assert budget_denial(run=RunView(Decimal("0"), None), definition=definition(max_duration_s=1),
                         spec=TOOL) is None


def test_a_definition_without_a_budget_is_never_denied(db):
    assert budget_denial(run=RunView(Decimal("1000"), now() - timedelta(days=1)),
                         definition={}, spec=AGENT) is None
