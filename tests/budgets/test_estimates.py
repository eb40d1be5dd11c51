"""What a run is projected to cost and take before it starts (`run_estimate`), from the same
estimates its reservations use, and how prices are recorded and applied.

- A step's cost per call is the average of its own recent succeeded attempts in its workflow,
  before the model's in any step; a map is estimated per item even with a cap of its own; a
  step that calls no model costs nothing.
- A map's number of calls is told from the run input alone (no upstream output yet), else one.
- A step's duration is the average of its completed runs in the same workflow; the run's is its
  longest chain of steps, rounded to the millisecond.
- A price recorded for one model never prices another; recording one is audited as created for
  its model, and an unregistered model is refused by name.

The history is made through the worker's own services (claim, succeed, fail) on the engine's
clock, so the attempts and step rows are the engine's own.
"""
from decimal import Decimal

import pytest

from audit.models import AuditEntry
from budgets.models import ModelPrice
from budgets.services import cost_of, model_price_create, run_estimate
from orchestrator.engine.retry import StepError
from orchestrator.engine.services.kinds.worker import Usage, step_claim, step_fail, step_succeed
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role
from tests.conftest import client_for
from tests.factories import SETUP, member

pytestmark = pytest.mark.django_db


def agent(name, *, model="fast", after=(), **extra):
    return {"name": name, "type": "agent", "model": model, "prompt": "hi", "after": list(after),
            "output_schema": {"type": "object"}, **extra}


def echo(name, *, after=()):
    return {"name": name, "type": "tool", "tool": "core.echo", "after": list(after)}


def each_item(name, *, over, after=(), **extra):
    return {"name": name, "type": "map", "over": over, "after": list(after), **extra,
            "item": {"type": "agent", "model": "fast", "prompt": "hi", "output_schema": {"type": "object"}}}


def save(team, name, steps, *, budget=None):
    version, _ = workflow_save(team=team, definition={
        "name": name, "input_schema": {"type": "object"}, "budget": budget or {}, "steps": steps},
        actor=SETUP)
    return version


@pytest.fixture
def clock(move_clock):
    """The engine's clock, moved forward by `clock(seconds)`."""
    elapsed = [0.0]

    def advance(seconds: float) -> None:
        elapsed[0] += seconds
        move_clock(elapsed[0])

    return advance


@pytest.fixture
def ran(clock):
    """`ran(version, {step: (seconds, cost)})`: one past run, its steps claimed in that order,
    each taking `seconds` and costing `cost` (a cost of None: the attempt failed for good)."""

    def run_once(version, steps: dict[str, tuple[float, str | None]]):
        run = run_start(version=version, input={}, actor=SETUP)
        for name, (seconds, cost) in steps.items():
            step = run.steps.get(name=name)
            claim = step_claim(step_id=step.id, worker="test")
            assert claim is not None, f"{name} was not queued"
            clock(seconds)
            if cost is None:
                step_fail(step_id=step.id, attempt=claim.attempt, error=StepError("permanent", "broken"),
                          usage=Usage(model="fast"), worker="test")
            else:
                step_succeed(step_id=step.id, attempt=claim.attempt, output={}, worker="test",
                             usage=Usage(tokens_in=10, tokens_out=10, cost_usd=Decimal(cost), model="fast"))
        return run

    return run_once


def by_step(estimate) -> dict:
    return {s.step: (s.calls, s.cost_usd, s.duration_s) for s in estimate.steps}


# --- cost -----------------------------------------------------------------------------------


def test_a_step_is_estimated_from_its_own_attempts_in_its_workflow_before_the_models(team, ran, settings):
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"
    plan = save(team, "plan", [agent("a"), agent("b")])
    ran(plan, {"a": (1, "0.30"), "b": (1, "0.20")})
    ran(save(team, "other", [agent("a")]), {"a": (1, "0.90")})  # the same step name and model elsewhere

    estimate = run_estimate(version=plan, run_input={})

    # Neither the other step of the workflow nor the same-named step of another workflow counts;
    # the model's average over all three would be 0.466667.
    assert {s.step: s.cost_usd for s in estimate.steps} == {"a": Decimal("0.30"), "b": Decimal("0.20")}
    assert estimate.cost_usd == Decimal("0.50")


def test_a_map_with_its_own_cap_is_still_estimated_per_item_from_history(team, settings):
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"
    version = save(team, "fan", [each_item("each", over="input.items", max_cost_usd=0.5)])

    estimate = run_estimate(version=version, run_input={"items": [1, 2, 3]})

    # A map's cap limits all its items together; it is not what one item is expected to cost.
    assert by_step(estimate) == {"each": (3, Decimal("0.30"), None)}


def test_a_step_that_calls_no_model_is_estimated_at_nothing_and_no_limit_is_within_budget(team, settings):
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"
    version = save(team, "mixed", [echo("fetch"), agent("write", after=["fetch"])])

    estimate = run_estimate(version=version, run_input={})

    assert by_step(estimate) == {"fetch": (0, Decimal(0), None), "write": (1, Decimal("0.10"), None)}
    assert (estimate.cost_usd, estimate.limit_usd, estimate.within_budget) == (Decimal("0.10"), None, True)


@pytest.mark.parametrize("over, run_input, calls", [
    ("input.items", {"items": [1, 2, 3]}, 3),
    # It reads an upstream step's output, unknown before the run: one item is the floor.
    ("steps.plan.output.items", {"items": [1, 2, 3]}, 1),
    # Not a list (the run would fail to fan out): one call, not the length of a string.
    ("input.items", {"items": "abc"}, 1),
    # Evaluated with no upstream outputs yet (`steps` is empty, not unknown).
    ('"plan" in steps ? steps.plan.output.items : input.items', {"items": [1, 2, 3]}, 3),
])
def test_a_maps_calls_are_told_from_the_run_input_alone(team, settings, over, run_input, calls):
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"
    version = save(team, "fan", [echo("plan"), each_item("each", over=over, after=["plan"])])

    estimate = run_estimate(version=version, run_input=run_input)

    assert by_step(estimate)["each"] == (calls, Decimal("0.10") * calls, None)


# --- duration -------------------------------------------------------------------------------


def test_a_steps_duration_is_the_average_of_its_completed_runs(team, ran):
    version = save(team, "plan", [agent("a")])
    ran(version, {"a": (1.0, "0.10")})
    ran(version, {"a": (3.0, "0.10")})

    estimate = run_estimate(version=version, run_input={})

    assert estimate.steps[0].duration_s == 2.0
    assert estimate.duration_s == 2.0


def test_only_completed_runs_of_the_same_step_in_the_same_workflow_set_its_duration(team, ran):
    plan = save(team, "plan", [agent("a"), agent("b")])
    ran(plan, {"a": (1.0, "0.10"), "b": (5.0, "0.10")})
    ran(plan, {"a": (50.0, None)})  # failed after 50 s: not a duration to expect
    ran(save(team, "other", [agent("a")]), {"a": (100.0, "0.10")})

    estimate = run_estimate(version=plan, run_input={})

    assert {s.step: s.duration_s for s in estimate.steps} == {"a": 1.0, "b": 5.0}


def test_the_runs_duration_is_its_longest_chain_of_steps(team, ran):
    version = save(team, "chain", [agent("a"), agent("b", after=["a"]), agent("c", after=["a"])])
    ran(version, {"a": (1.0, "0.10"), "b": (2.0, "0.10"), "c": (0.5, "0.10")})

    estimate = run_estimate(version=version, run_input={})

    assert {s.step: s.duration_s for s in estimate.steps} == {"a": 1.0, "b": 2.0, "c": 0.5}
    assert estimate.duration_s == 3.0  # a then b; c runs beside b


def test_the_runs_duration_is_rounded_to_the_millisecond(team, ran):
    version = save(team, "plan", [agent("a")])
    ran(version, {"a": (2.5004, "0.10")})

    estimate = run_estimate(version=version, run_input={})

    assert estimate.steps[0].duration_s == pytest.approx(2.5004)
    assert estimate.duration_s == 2.5


# --- prices ---------------------------------------------------------------------------------


def test_a_price_recorded_for_one_model_does_not_price_another(db):
    model_price_create(model="deep", input_usd_per_mtok=Decimal(100), output_usd_per_mtok=Decimal(100),
                       actor=SETUP)

    # `fast` has no price of its own: the registry's applies.
    assert cost_of({"input_usd_per_mtok": 1, "output_usd_per_mtok": 2}, 1_000_000, 1_000_000,
                   model="fast") == Decimal(3)
    assert cost_of({}, 1_000_000, 0, model="deep") == Decimal(100)


def test_a_recorded_price_is_audited_as_created_for_its_model(db):
    row = model_price_create(model="fast", input_usd_per_mtok=Decimal(1), output_usd_per_mtok=Decimal(2),
                             actor=SETUP)

    entry = AuditEntry.objects.get(action="budget.price_created")
    assert (entry.subject_id, entry.outcome, entry.model) == (str(row.id), "created", "fast")


def test_a_price_for_an_unregistered_model_is_refused_naming_it(team):
    root = member(team, "root", role=Role.OWNER, staff=True)
    root.is_superuser = True
    root.save()

    response = client_for(root).post("/api/v1/model-prices/", {
        "model": "nope", "input_usd_per_mtok": "1", "output_usd_per_mtok": "1"}, format="json")

    assert response.status_code == 400
    assert response.json()["errors"] == [
        {**response.json()["errors"][0], "path": "model",
         "message": "no model 'nope' is registered (STEPWISE_MODELS)"}]
    assert not ModelPrice.objects.exists()
