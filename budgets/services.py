"""Cost and latency budgets, enforced before every dispatch.

`cost_of` prices tokens from the model registry. `budget_denial` projects a step's cost (the
model's historical average per attempt, or a conservative default) onto the run's spend and
compares spend and elapsed time with the workflow's budget. It only reads; the scheduler
service pauses the run when it returns a denial.
"""
from decimal import Decimal

from django.conf import settings
from django.db.models import Avg

from orchestrator.clock import now
from orchestrator.models import StepAttempt

MTOK = Decimal(1_000_000)


def cost_of(model_config: dict, tokens_in: int, tokens_out: int) -> Decimal:
    """USD for a call, from the registry's per-million-token prices (missing prices cost 0)."""
    price_in = Decimal(str(model_config.get("input_usd_per_mtok", 0)))
    price_out = Decimal(str(model_config.get("output_usd_per_mtok", 0)))
    return (price_in * tokens_in + price_out * tokens_out) / MTOK


def projected_cost(spec: dict) -> Decimal:
    """What one more attempt of `spec` is expected to cost."""
    if spec["type"] not in ("agent", "map"):
        return Decimal("0")
    model = spec["model"] if spec["type"] == "agent" else spec["item"].get("model")
    if not model:
        return Decimal("0")
    average = StepAttempt.objects.filter(model=model, outcome="succeeded").aggregate(a=Avg("cost_usd"))["a"]
    return Decimal(str(average)) if average is not None else Decimal(settings.STEPWISE_DEFAULT_STEP_COST_USD)


def budget_denial(*, run, definition: dict, spec: dict) -> dict | None:
    """Why dispatching `spec` now would break the run's budget, or None if it may go."""
    budget = definition.get("budget") or {}
    max_cost = budget.get("max_cost_usd")
    if max_cost is not None:
        projected = run.cost_usd + projected_cost(spec)
        if projected > Decimal(str(max_cost)):
            return {"class": "budget", "step": spec["name"],
                    "message": f"projected cost ${projected:.4f} exceeds the budget ${Decimal(str(max_cost)):.2f}"}
    max_duration = budget.get("max_duration_s")
    if max_duration is not None and run.started_at is not None:
        elapsed = (now() - run.started_at).total_seconds()
        if elapsed > max_duration:
            return {"class": "budget", "step": spec["name"],
                    "message": f"elapsed {elapsed:.0f}s exceeds the budget of {max_duration}s"}
    return None
