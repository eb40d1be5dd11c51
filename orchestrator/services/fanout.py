"""Map steps (a Celery chord over items) and sub-workflows (child runs).

The database stays the source of truth: each item's result is persisted before the chord
counts it, the join reads the items from the database, and the reaper joins a map whose
chord callback was lost, or re-sends item tasks that were lost.
"""
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from django.db import transaction
from django.db.models import F, Q

from ..clock import now
from ..dispatch import map_items_redispatch_on_commit, queue_for
from ..events import event_record
from ..executors import ExecContext, execute
from ..leases import heartbeat, lease_until
from ..models import MapItem, Run, RunState, StepRun, StepState
from ..retry import StepError, retry_at
from .advance import lock_run, run_advance
from .runs import run_settle_cancel
from .steps import BROKER_DELAY_LIMIT_S, idempotency_key_for
from .versions import definition_of, runs_with_version

DONE, SKIPPED, DEFERRED, RETRY = "done", "skipped", "deferred", "retry"
# A countdown message may arrive this much before the due time another host computed.
CLOCK_SKEW = timedelta(seconds=1)


@dataclass(frozen=True)
class ItemOutcome:
    verdict: str
    delay_s: float = 0.0


def map_item_run(*, step_id: int, index: int) -> ItemOutcome:
    """Run one attempt of item `index` of a waiting map step and persist its outcome.

    DONE: the item finished (with an output, or with an error its retry policy will not retry).
    SKIPPED: nothing to do (finished, running elsewhere, not due, run not live, or a retry
    delay long enough to wait in the database for the reaper). DEFERRED: the run already has
    max_parallel items in flight; the caller puts this one back at the end of the queue, which
    keeps one large fan-out from starving every other run. RETRY: the attempt failed and the
    item's retry policy wants another after `delay_s`.
    """
    item = MapItem.objects.select_related("step").filter(step_id=step_id, index=index).first()
    if item is None or item.done or item.step.state != StepState.WAITING:
        return ItemOutcome(SKIPPED)
    run = runs_with_version().get(id=item.step.run_id)
    if run.state not in (RunState.RUNNING, RunState.WAITING):
        return ItemOutcome(SKIPPED)
    definition, graph = definition_of(run)
    spec = graph.steps[item.step.name]["item"]
    verdict, attempt = _take_slot(item, run, cap=definition["max_parallel"], timeout_s=spec["timeout_s"])
    if verdict != DONE:
        return ItemOutcome(verdict)
    step_input = {**(item.step.input or {}), "item": item.item, "index": index}
    ctx = ExecContext(str(run.id), run.version.workflow.name, item.step.name, attempt,
                      idempotency_key_for(run, item.step.name, f"item-{index}"), step_id=item.step_id)
    try:
        with heartbeat(lambda: bool(_owned(item, attempt).update(lease_expires_at=lease_until())),
                       name=f"item-{item.id}"):
            result = execute(spec, step_input, ctx)
    except StepError as error:
        return _attempt_failed(item, attempt, spec, error, spent=getattr(error, "spent", None))
    _finish(item, attempt, output=result.output, error=None, spent=result)
    return ItemOutcome(DONE)


def _take_slot(item: MapItem, run: Run, *, cap: int, timeout_s: int) -> tuple[str, int]:
    """Claim `item` under a lease if the run has fewer than `cap` items in flight.

    Returns (DONE, the attempt's number), (DEFERRED, 0) or (SKIPPED, 0): not due yet, or leased
    by another worker — or by a dead one, which only the reaper may turn into a new attempt.
    """
    at = now()
    with transaction.atomic():
        if _in_flight(run.id, at).exclude(id=item.id).count() >= cap:
            return DEFERRED, 0
        taken = MapItem.objects.filter(
            id=item.id, done=False, lease_expires_at__isnull=True, due_at__lte=at + CLOCK_SKEW,
        ).update(attempts=F("attempts") + 1, claimed_at=at, deadline_at=at + timedelta(seconds=timeout_s),
                 lease_expires_at=lease_until(at))
        if not taken:
            return SKIPPED, 0
        return DONE, MapItem.objects.values_list("attempts", flat=True).get(id=item.id)


def _in_flight(run_id, at):
    """The run's items under a live lease: what max_parallel caps."""
    return MapItem.objects.filter(step__run_id=run_id, done=False, lease_expires_at__gt=at)


def _owned(item: MapItem, attempt: int):
    """The item, only while `attempt` still holds it: a late finisher changes nothing."""
    return MapItem.objects.filter(id=item.id, done=False, attempts=attempt, lease_expires_at__isnull=False)


def _charge(item: MapItem, spent) -> None:
    """Every attempt's spend counts, even one that finished after the item moved on."""
    if spent is not None and (spent.tokens_in or spent.tokens_out or spent.cost_usd):
        MapItem.objects.filter(id=item.id).update(
            tokens_in=F("tokens_in") + spent.tokens_in, tokens_out=F("tokens_out") + spent.tokens_out,
            cost_usd=F("cost_usd") + spent.cost_usd)


def _finish(item: MapItem, attempt: int, *, output, error: dict | None, spent) -> None:
    _charge(item, spent)
    _owned(item, attempt).update(done=True, finished_at=now(), output=output, error=error,
                                 lease_expires_at=None, deadline_at=None)


def _attempt_failed(item: MapItem, attempt: int, spec: dict, error: StepError, *, spent=None) -> ItemOutcome:
    """An attempt ended in `error`: the item's retry policy decides between another and done."""
    at = now()
    when = retry_at(spec["retry"], attempts=attempt, error=error, at=at)
    if when is None:
        _finish(item, attempt, output=None, error=error.as_dict(), spent=spent)
        return ItemOutcome(DONE)
    _charge(item, spent)
    delay = max((when - at).total_seconds(), 0)
    in_broker = delay <= BROKER_DELAY_LIMIT_S  # else it waits in the database for the reaper
    with transaction.atomic():
        if not _owned(item, attempt).update(lease_expires_at=None, deadline_at=None, due_at=when,
                                            error=error.as_dict(), sent_at=when if in_broker else F("sent_at")):
            return ItemOutcome(SKIPPED)
        step = StepRun.objects.select_related("run").get(id=item.step_id)
        event_record(run=step.run, step=step, kind="step.item_retrying",
                     payload={"index": item.index, "attempt": attempt, "error": error.as_dict(),
                              "at": when.isoformat()})
    return ItemOutcome(RETRY, delay) if in_broker else ItemOutcome(SKIPPED)


def map_items_recover(*, step_id: int, stale_before) -> int:
    """The reaper's pass over a waiting map step's unfinished items; returns how many it sent.

    - an attempt whose lease expired (its worker died) or that overran the item's timeout_s
      ended without a word: the item's retry policy decides, as for any failed attempt;
    - an item due whose message is missing — never sent (a retry delay too long for the
      broker) or sent before `stale_before` and never taken although the run has room to run
      it (a message the broker lost) — is sent again.
    """
    run = runs_with_version().get(steps__id=step_id)
    definition, graph = definition_of(run)
    step = StepRun.objects.only("name").get(id=step_id)
    spec = graph.steps[step.name]["item"]
    at = now()
    pending = MapItem.objects.filter(step_id=step_id, done=False)
    delayed: dict[int, float] = {}
    for item in pending.filter(lease_expires_at__isnull=False).filter(
            Q(lease_expires_at__lt=at) | Q(deadline_at__lt=at)):
        error = (StepError("timeout", f"item {item.index} ran past its timeout_s")
                 if item.deadline_at and item.deadline_at < at
                 else StepError("lost", "the worker running it stopped renewing its lease"))
        outcome = _attempt_failed(item, item.attempts, spec, error)
        if outcome.verdict == RETRY:
            delayed[item.index] = outcome.delay_s
    due = pending.filter(lease_expires_at__isnull=True, due_at__lte=at)
    missing = Q(sent_at__lt=F("due_at"))
    if _in_flight(run.id, at).count() < definition["max_parallel"]:
        missing |= Q(sent_at__lt=stale_before)
    resend = list(due.filter(missing).values_list("index", flat=True))
    due.filter(index__in=resend).update(sent_at=at)
    sends = {**dict.fromkeys(resend, 0.0), **delayed}
    if sends:
        with transaction.atomic():
            map_items_redispatch_on_commit(step_id, sends, queue_for(spec))
    return len(sends)


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
