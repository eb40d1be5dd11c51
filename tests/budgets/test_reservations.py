"""Reserve before dispatch, settle after (`budgets.services`, `services/budget_gate.py`): every
edge is a table row or a named case, driven through the services a worker and an operator call.

A model step without history is estimated at STEPWISE_DEFAULT_STEP_COST_USD, set per test. The
test transaction never commits, so no message is consumed; steps are finished here as a worker
would finish them, with the usage the test says they spent.
"""
from decimal import Decimal

import pytest

from alerts.detection import alerts_scan
from budgets.models import BudgetAlert, Reservation
from budgets.selectors import run_budget
from notifications.models import Notification
from orchestrator.engine.errors import BudgetExceeded, Forbidden
from orchestrator.engine.retry import StepError
from orchestrator.engine.selectors import definition_of
from orchestrator.engine.services.kinds import map_step
from orchestrator.engine.services.kinds.worker import (
    Usage,
    step_claim,
    step_fail,
    step_retry_due,
    step_succeed,
)
from orchestrator.engine.services.operators import run_budget_raise, run_resume, step_retry
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import DeadLetter, MapItem, Run, StepRun
from tests.factories import SETUP

pytestmark = pytest.mark.django_db
TRANSIENT = StepError("transient", "the model was busy")


def usd(value) -> str:
    return str(Decimal(str(value)).quantize(Decimal("0.000001")))


def agent(name: str, *, after=(), **extra) -> dict:
    return {"name": name, "type": "agent", "model": "fast", "prompt": "hi", "after": list(after),
            "output_schema": {"type": "object"}, **extra}


def start(team, steps: list[dict], *, budget: float | None = None, on_error: str = "pause",
          input_: dict | None = None, name: str = "spender") -> Run:
    definition = {"name": name, "input_schema": {"type": "object"}, "on_error": on_error,
                  "budget": {"max_cost_usd": budget}, "steps": steps}
    version, _ = workflow_save(team=team, definition=definition, actor=SETUP)
    return run_start(version=version, input=input_ or {}, actor=SETUP)


def spend(run: Run, name: str, cost: str, *, error: StepError | None = None, model: str = "fast") -> None:
    """A worker claims step `name` and finishes it, having spent `cost`."""
    step = run.steps.get(name=name)
    claim = step_claim(step_id=step.id, worker="test")
    assert claim is not None, f"{name} is {step.state}, not queued"
    usage = Usage(tokens_in=10, tokens_out=10, cost_usd=Decimal(cost), model=model, provider="scripted")
    if error:
        step_fail(step_id=step.id, attempt=claim.attempt, error=error, usage=usage, worker="test")
    else:
        step_succeed(step_id=step.id, attempt=claim.attempt, output={}, usage=usage, worker="test")


def states(run: Run) -> tuple[str, dict]:
    run = Run.objects.get(pk=run.pk)
    return run.state, dict(run.steps.values_list("name", "state"))


def reservations(run: Run) -> list[tuple]:
    return list(Reservation.objects.filter(run=run).order_by("id").values_list(
        "step__name", "attempt", "item", "state", "amount", "actual"))


# --- the run's limit: at it, one cent over, estimates below and above the actual -----------


@pytest.mark.parametrize("first_cost, estimate, limit, dispatched", [
    ("0.40", "0.10", 0.50, True),    # 0.40 spent + 0.10 reserved = 0.50: exactly the limit goes
    ("0.41", "0.10", 0.50, False),   # one cent over: paused before the call
    ("0.00", "0.50", 0.50, True),    # the whole budget reserved by one step
    ("0.00", "0.51", 0.50, False),   # an estimate alone past the limit
])
def test_the_second_step_against_the_run_limit(team, settings, first_cost, estimate, limit, dispatched):
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"
    # `first` calls another model, so `second` has no history and is estimated at the default.
    run = start(team, [agent("first", model="deep"), agent("second", after=["first"])], budget=limit)
    settings.STEPWISE_DEFAULT_STEP_COST_USD = estimate
    spend(run, "first", first_cost, model="deep")

    state, steps = states(run)
    assert steps["second"] == ("queued" if dispatched else "ready")
    assert state == ("running" if dispatched else "paused")
    if not dispatched:
        error = Run.objects.get(pk=run.pk).error
        assert error == {
            "class": "budget", "level": "run", "step": "second", "limit_usd": usd(limit),
            "committed_usd": usd(first_cost), "projected_usd": usd(estimate),
            "message": f"run budget: ${Decimal(first_cost):.4f} committed + ${Decimal(estimate):.4f} "
                       f"projected for step 'second' would exceed the limit of ${limit:.2f}"}
        assert not Reservation.objects.filter(run=run, step__name="second").exists()


@pytest.mark.parametrize("actual, then_committed", [
    ("0.02", "0.02"),   # the estimate (0.10) was above what it cost: the difference is freed
    ("0.30", "0.30"),   # below: what it cost counts, not what was reserved
])
def test_a_call_is_settled_to_what_it_cost(team, settings, actual, then_committed):
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"
    run = start(team, [agent("only")], budget=1.0)
    assert run_budget(run).reserved_usd == Decimal("0.10")

    spend(run, "only", actual)

    assert reservations(run) == [("only", 1, -1, "settled", Decimal("0.10"), Decimal(actual))]
    figures = run_budget(Run.objects.get(pk=run.pk))
    assert (figures.spent_usd, figures.reserved_usd) == (Decimal(then_committed), 0)
    assert figures.remaining_usd == Decimal("1") - Decimal(then_committed)


def test_steps_dispatched_together_are_summed(team, settings):
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"
    run = start(team, [agent("left"), agent("right")], budget=0.15)
    assert states(run) == ("paused", {"left": "queued", "right": "ready"})
    assert [r[0] for r in reservations(run)] == ["left"]


def test_a_step_cap_is_its_estimate_and_a_retry_past_it_pauses(team, settings, move_clock):
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"
    retry = {"max_attempts": 3, "base_s": 1, "max_s": 1, "jitter": False}
    run = start(team, [agent("capped", max_cost_usd=0.25, retry=retry)])
    assert reservations(run) == [("capped", 1, -1, "reserved", Decimal("0.25"), None)]

    spend(run, "capped", "0.25", error=TRANSIENT)  # the first attempt spent all of it
    move_clock(5)
    assert step_retry_due(step_id=run.steps.get().id) is False

    assert states(run) == ("paused", {"capped": "retrying"})
    error = Run.objects.get(pk=run.pk).error
    assert (error["level"], error["limit_usd"], error["committed_usd"]) == ("step", usd("0.25"), usd("0.25"))


# --- a retry, a map item, a redrive crossing the limit ---------------------------------------


def test_a_retry_that_would_cross_pauses_then_raise_resume_and_complete(team, settings, operator, move_clock):
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"
    retry = {"max_attempts": 3, "base_s": 1, "max_s": 1, "jitter": False}
    run = start(team, [agent("think", retry=retry), agent("write", after=["think"])], budget=0.30)
    spend(run, "think", "0.25", error=TRANSIENT)
    move_clock(5)
    step_id = run.steps.get(name="think").id

    assert step_retry_due(step_id=step_id) is False  # 0.25 + 0.10 > 0.30: not dispatched
    assert states(run) == ("paused", {"think": "retrying", "write": "blocked"})
    assert Run.objects.get(pk=run.pk).error["level"] == "run"
    alerts_scan()
    denied = Notification.objects.get(kind="alert.budget.denied")
    assert denied.recipients == ["operator@example.com"]
    assert "0.2500 committed + $0.1000 projected" in denied.body

    run_budget_raise(run_id=run.id, max_cost_usd=Decimal("1.00"), reason="a long ticket", actor=operator)
    assert states(run)[0] == "running"
    assert step_retry_due(step_id=step_id) is True  # the reaper finds it due
    spend(run, "think", "0.05")
    spend(run, "write", "0.05")

    assert states(run) == ("completed", {"think": "completed", "write": "completed"})
    figures = run_budget(Run.objects.get(pk=run.pk))
    assert (figures.limit_usd, figures.spent_usd, figures.reserved_usd, figures.overridden) == (
        Decimal("1.00"), Decimal("0.35"), 0, True)
    definition = Run.objects.get(pk=run.pk).version.normalized
    assert definition["budget"]["max_cost_usd"] == 0.30  # the definition is untouched


def test_a_map_reserves_per_item_and_pauses_before_fanning_out(team, settings):
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"
    each = {"name": "each", "type": "map", "over": "input.items",
            "item": {"type": "agent", "model": "fast", "prompt": "{{ item }}", "output_schema": {"type": "object"}}}
    run = start(team, [each], budget=0.25, input_={"items": [1, 2, 3]})
    assert states(run) == ("paused", {"each": "ready"})
    assert not MapItem.objects.exists()
    assert Run.objects.get(pk=run.pk).error["projected_usd"] == usd("0.30")


def test_a_map_item_retry_that_would_cross_pauses_the_run(team, settings):
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"
    each = {"name": "each", "type": "map", "over": "input.items",
            "item": {"type": "agent", "model": "fast", "prompt": "{{ item }}", "output_schema": {"type": "object"},
                     "retry": {"max_attempts": 3, "base_s": 1, "max_s": 1, "jitter": False}}}
    run = start(team, [each], budget=0.30, input_={"items": [1, 2, 3]})
    assert states(run) == ("waiting", {"each": "waiting"})  # 3 x 0.10: exactly the limit
    step = run.steps.get()
    assert [r[2] for r in reservations(run)] == [0, 1, 2]
    item = MapItem.objects.get(step=step, index=0)
    verdict, attempt = map_step._take_slot(item, Run.objects.get(pk=run.pk), cap=10, timeout_s=60)
    assert (verdict, attempt) == ("done", 1)
    item_spec = definition_of(run)[1].steps["each"]["item"]  # retried on transient errors
    map_step._attempt_failed(item, 1, item_spec, TRANSIENT, spent=Usage(cost_usd=Decimal("0.10")))

    verdict, _ = map_step._take_slot(MapItem.objects.get(pk=item.pk), Run.objects.get(pk=run.pk), cap=10,
                                     timeout_s=60)
    assert verdict == "skipped"  # its second attempt would make 0.40
    assert states(run)[0] == "paused"
    assert MapItem.objects.get(pk=item.pk).attempts == 1


def test_a_redrive_over_budget_is_refused_and_changes_nothing(team, settings, operator):
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"
    run = start(team, [agent("think")], budget=0.20)
    spend(run, "think", "0.15", error=StepError("permanent", "no"))
    assert states(run) == ("paused", {"think": "failed"})

    with pytest.raises(BudgetExceeded, match="run budget"):
        step_retry(step_id=run.steps.get().id, actor=operator)
    assert states(run) == ("paused", {"think": "failed"})
    assert DeadLetter.objects.get(run=run).status == "open"

    run_budget_raise(run_id=run.id, max_cost_usd=Decimal("0.50"), reason="worth it", actor=operator)
    assert states(run)[0] == "paused"  # a failed step: it is retried, not resumed around
    step_retry(step_id=run.steps.get().id, actor=operator)
    spend(run, "think", "0.05")
    assert states(run)[0] == "completed"


def test_resuming_without_raising_pauses_again_before_the_call(team, settings, operator):
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"
    run = start(team, [agent("think")], budget=0.05)
    alerts_scan()
    run_resume(run_id=run.id, actor=operator)
    assert states(run) == ("paused", {"think": "ready"})
    alerts_scan()
    assert Notification.objects.filter(kind="alert.budget.denied").count() == 1  # once per run and level


def test_raising_a_budget_needs_the_permission(team, settings, requester):
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"
    run = start(team, [agent("think")], budget=0.05)
    with pytest.raises(Forbidden):
        run_budget_raise(run_id=run.id, max_cost_usd=Decimal("1"), reason="please", actor=requester)
    assert states(run)[0] == "paused"


# --- warnings --------------------------------------------------------------------------------


def test_the_warning_goes_out_once_per_run_and_level(team, settings, operator):
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.45"
    run = start(team, [agent("a"), agent("b", after=["a"]), agent("c", after=["b"])], budget=1.0)
    assert not BudgetAlert.objects.exists()  # 0.45 of 1.00
    spend(run, "a", "0.40")                  # then b reserves: 0.40 + 0.45 = 0.85 >= 0.80
    alerts_scan()
    assert Notification.objects.filter(kind="alert.budget.warning").count() == 1
    spend(run, "b", "0.05")                  # c reserves: 0.45 + 0.45 = 0.90, still past it
    spend(run, "c", "0.05")
    alerts_scan()

    assert states(run)[0] == "completed"
    warning = Notification.objects.get(kind="alert.budget.warning")
    assert warning.subject == "[Stepwise warning] Budget reached its warning threshold: spender (run)"
    assert warning.recipients == ["operator@example.com"]


def test_the_warning_fraction_is_configurable(team, settings, operator):
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.45"
    settings.STEPWISE_BUDGET_WARN_AT = "0.4"
    start(team, [agent("a")], budget=1.0)
    alerts_scan()
    assert Notification.objects.filter(kind="alert.budget.warning").count() == 1


# --- what is released ----------------------------------------------------------------------


def test_a_cancelled_queued_step_releases_its_reservation(team, settings, operator):
    from orchestrator.engine.services.runs import run_cancel

    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"
    run = start(team, [agent("think")], budget=1.0)
    run_cancel(run_id=run.id, actor=operator)
    assert reservations(run) == [("think", 1, -1, "released", Decimal("0.10"), Decimal("0"))]
    assert run_budget(Run.objects.get(pk=run.pk)).reserved_usd == 0


def test_a_replayed_dispatch_is_not_reserved_twice(team, settings):
    from budgets.services import budget_reserve
    from orchestrator.engine.selectors import lock_run

    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"
    run = start(team, [agent("think")], budget=1.0)
    step = StepRun.objects.get(run=run)
    locked = lock_run(run.id)
    definition, graph = definition_of(locked)
    budget_reserve(run=locked, step=step, spec=graph.steps["think"], definition=definition, attempt=1)
    assert len(reservations(run)) == 1
