"""Map steps (a Celery chord over items) and sub-workflows (child runs).

The database stays the source of truth: each item's result is persisted before the chord
counts it, the join reads the items from the database, and the reaper joins a map whose
chord callback was lost, or re-sends item tasks that were lost.
"""
from datetime import timedelta
from decimal import Decimal

from django.db import transaction
from django.db.models import Q

from ..clock import now
from ..events import event_record
from ..executors import ExecContext, execute
from ..models import MapItem, Run, RunState, StepRun, StepState
from ..retry import StepError
from .advance import lock_run, run_advance
from .runs import run_settle_cancel
from .steps import idempotency_key_for
from .versions import definition_of, runs_with_version

DONE, SKIPPED, DEFERRED = "done", "skipped", "deferred"


def map_item_run(*, step_id: int, index: int) -> str:
    """Execute item `index` of a waiting map step and persist its result.

    Returns DONE, SKIPPED (nothing to do: finished, duplicate, run not live) or DEFERRED: the
    run already has max_parallel items in flight, so the caller puts this one back at the end
    of the queue — which is what keeps one large fan-out from starving every other run.
    """
    item = MapItem.objects.select_related("step").filter(step_id=step_id, index=index).first()
    if item is None or item.done or item.step.state != StepState.WAITING:
        return SKIPPED
    run = runs_with_version().get(id=item.step.run_id)
    if run.state not in (RunState.RUNNING, RunState.WAITING):
        return SKIPPED
    definition, graph = definition_of(run)
    spec = graph.steps[item.step.name]["item"]
    verdict = _take_slot(item, run, cap=definition["max_parallel"], stale_s=spec["timeout_s"])
    if verdict != DONE:
        return verdict
    step_input = {**(item.step.input or {}), "item": item.item, "index": index}
    ctx = ExecContext(str(run.id), run.version.workflow.name, item.step.name, 1,
                      idempotency_key_for(run, item.step.name, f"item-{index}"), step_id=item.step_id)
    try:
        result = execute(spec, step_input, ctx)
        fields = {"output": result.output, "error": None, "tokens_in": result.tokens_in,
                  "tokens_out": result.tokens_out, "cost_usd": result.cost_usd}
    except StepError as exc:
        spent = getattr(exc, "spent", None)  # model calls that failed still cost tokens
        fields = {"output": None, "error": exc.as_dict()}
        if spent is not None:
            fields.update(tokens_in=spent.tokens_in, tokens_out=spent.tokens_out,
                          cost_usd=spent.cost_usd)
    # Only the first finisher records: a duplicate delivery changes nothing.
    MapItem.objects.filter(id=item.id, done=False).update(done=True, finished_at=now(), **fields)
    return DONE


def _take_slot(item: MapItem, run: Run, *, cap: int, stale_s: int) -> str:
    """Claim `item` if the run has fewer than `cap` items in flight (a claim older than the
    item's timeout is presumed dead)."""
    at = now()
    fresh = Q(claimed_at__gt=at - timedelta(seconds=stale_s))
    with transaction.atomic():
        in_flight = (MapItem.objects.filter(fresh, step__run_id=run.id, done=False)
                     .exclude(id=item.id).count())
        if in_flight >= cap:
            return DEFERRED
        taken = (MapItem.objects.filter(id=item.id, done=False).exclude(fresh)
                 .update(claimed_at=at))
    return DONE if taken else SKIPPED


def merge(strategy: str, items: list[MapItem]) -> tuple[object, dict | None]:
    """Merge item results: (output, None) or (None, error)."""
    failed = [i.index for i in items if i.error]
    if strategy == "first_success":
        for i in items:
            if not i.error:
                return i.output, None
        return None, {"class": "map_failed", "message": f"no item succeeded ({len(items)} failed)"}
    if failed:
        return None, {"class": "map_failed", "message": f"items {failed} failed",
                      "errors": {str(i.index): i.error for i in items if i.error}}
    if strategy == "dict_merge":
        merged: dict = {}
        for i in items:
            if not isinstance(i.output, dict):
                return None, {"class": "invalid_output",
                              "message": f"item {i.index} output is not an object; dict_merge needs objects"}
            merged.update(i.output)
        return merged, None
    return [i.output for i in items], None


def map_join(*, step_id: int, actor: str = "service:chord") -> bool:
    """Join a map step once every item is done. False if it is not (yet) joinable."""
    with transaction.atomic():
        run = lock_run(StepRun.objects.values_list("run_id", flat=True).get(id=step_id))
        step = StepRun.objects.get(id=step_id)
        if step.state != StepState.WAITING:
            return False
        items = list(step.map_items.order_by("index"))
        if not items or not all(i.done for i in items):
            return False
        _, graph = definition_of(run)
        output, error = merge(graph.steps[step.name]["merge"], items)
        usage = {k: sum((getattr(i, k) for i in items), start=Decimal(0) if k == "cost_usd" else 0)
                 for k in ("tokens_in", "tokens_out", "cost_usd")}
        for key, value in usage.items():
            setattr(step, key, getattr(step, key) + value)
            setattr(run, key, getattr(run, key) + value)
        run.save(update_fields=list(usage))
        if error:
            step.fail(error=error)
        else:
            step.complete(output=output)
        step.save()
        event_record(run=run, step=step, kind=f"step.{step.state}", actor=actor,
                     payload={"items": len(items), "cost_usd": str(usage["cost_usd"]),
                              **({"error": error} if error else {})})
        if run.state == RunState.CANCELLING:
            run_settle_cancel(run, actor=actor)
        else:
            run_advance(run)
    return True


def child_finished(*, parent_step_id: int) -> bool:
    """Carry a finished child run's outcome into the parent step that waits for it."""
    with transaction.atomic():
        run = lock_run(StepRun.objects.values_list("run_id", flat=True).get(id=parent_step_id))
        step = StepRun.objects.get(id=parent_step_id)
        child = Run.objects.filter(parent_step=step).first()
        if step.state != StepState.WAITING or child is None or not child.is_terminal:
            return False
        if child.state == RunState.COMPLETED:
            step.complete(output=child.output)
        else:
            step.fail(error={"class": "child_" + child.state, "message": f"child run {child.id} ended {child.state}",
                             "child_run": str(child.id)})
        step.tokens_in, step.tokens_out, step.cost_usd = child.tokens_in, child.tokens_out, child.cost_usd
        step.save()
        for key in ("tokens_in", "tokens_out", "cost_usd"):
            setattr(run, key, getattr(run, key) + getattr(child, key))
        run.save(update_fields=["tokens_in", "tokens_out", "cost_usd"])
        event_record(run=run, step=step, kind=f"step.{step.state}", actor="service:sub_workflow",
                     payload={"child_run": str(child.id), "child_state": child.state})
        if run.state == RunState.CANCELLING:
            run_settle_cancel(run, actor="service:sub_workflow")
        else:
            run_advance(run)
    return True
