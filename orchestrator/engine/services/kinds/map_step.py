"""Map steps: a fan-out of items as a Celery chord, joined when every item is done.

The database stays the source of truth: `start` persists the items before the chord is sent;
each item's result is persisted before the chord counts it (`map_item_run`); the join reads
the items from the database (`map_join`), and the reaper joins a map whose chord callback was
lost, or recovers items that died, overran or whose message was lost (`map_items_recover`).
A map step that ends other than completed stops its items still to run (`release`).
"""
import json
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from functools import partial

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q

from budgets.services import budget_settle, cost_of
from orchestrator.models import MapItem, Run, StepRun

from ...attestation import attestation_problem, attestation_sign, output_digest, process_label
from ...authz import Actor, System, label
from ...clock import now
from ...definitions import ExpressionError, evaluate_expression
from ...dispatch import (
    BROKER_DELAY_LIMIT_S,
    batch_queue_for,
    map_dispatch_on_commit,
    map_items_redispatch_on_commit,
)
from ...events import event_record
from ...executors import ExecContext, execute
from ...hashing import digest_of
from ...keys import idempotency_key_for
from ...leases import heartbeat, lease_until
from ...retry import StepError, retry_at
from ...secret_inputs import revealed_for
from ...selectors import definition_of, effect_key_of, lock_run, lock_run_of_step, runs_with_version
from ...states import RUN_ADVANCING, StepKind, StepState
from ..attestations import Trace, answering_route, key_registered
from ..budget_gate import dispatch_reserve, run_pause_for_budget
from ..effects import effect_perform
from ..quotas import item_quota_reserve, step_quota_release
from ..scheduling import run_pause_for_attestation
from ..step_end import step_ended, waiting_step_time_out
from . import Record, StepKindHandler, register

CHORD = System("chord")


class MapStep(StepKindHandler):
    def start(self, run: Run, step: StepRun, spec: dict, record: Record) -> None:
        try:
            items = evaluate_expression(spec["over"], step.input)
            if not isinstance(items, list):
                raise ExpressionError(f"'over' must produce a list, got {type(items).__name__}")
        except ExpressionError as exc:
            step.await_event(timeout_s=spec["timeout_s"])
            step.fail(error={"class": "validation", "message": str(exc)})
            record(step, "step.failed", step.error)
            return
        step.await_event(timeout_s=spec["timeout_s"])
        if not items:
            step.complete(output=[] if spec["merge"] == "list" else {})
            record(step, "step.completed", {"items": 0})
            return
        step.save()
        at = now()
        MapItem.objects.bulk_create(MapItem(step=step, index=i, item=it, due_at=at, sent_at=at)
                                    for i, it in enumerate(items))
        record(step, "step.waiting", {"for": "map", "items": len(items)})
        map_dispatch_on_commit(step.id, list(range(len(items))),
                               batch_queue_for(spec["item"], capacity=run.capacity),
                               run_id=step.run_id, step_name=step.name)

    def time_out(self, *, step_id: int, reason: str) -> bool:
        return waiting_step_time_out(step_id=step_id, reason=reason)

    def release(self, run: Run, step: StepRun, *, actor: Actor) -> None:
        """Items not yet done will not run: mark them done, cancelled. An item running right
        now finishes its call, but its result is ignored (it no longer holds the item)."""
        stopped = MapItem.objects.filter(step=step, done=False).update(
            done=True, finished_at=now(), lease_expires_at=None, deadline_at=None,
            error={"class": "cancelled", "message": f"map step ended {step.state}"})
        if stopped:
            event_record(run=run, step=step, kind="step.items_cancelled", actor=label(actor),
                         payload={"items": stopped})


register(StepKind.MAP, MapStep())


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
    if run.state not in RUN_ADVANCING:
        return ItemOutcome(SKIPPED)
    definition, graph = definition_of(run)
    spec = graph.steps[item.step.name]["item"]
    reservation = None
    if settings.STEPWISE_QUOTAS:
        # Its share of a provider quota first, as a step's: an item that would overrun it waits.
        reserved = item_quota_reserve(run=run, step=item.step, spec=spec,
                                      item_input={**(item.step.input or {}), "item": item.item})
        if isinstance(reserved, float):
            return ItemOutcome(DEFERRED, delay_s=reserved)
        reservation = reserved
    spent = [0]
    try:
        return _item_attempt(item, run, definition, spec, index, spent)
    finally:
        step_quota_release(reservation, tokens_used=spent[0])


def _item_attempt(item: MapItem, run: Run, definition: dict, spec: dict, index: int,
                  spent: list[int]) -> ItemOutcome:
    verdict, attempt = _take_slot(item, run, cap=definition["max_parallel"], timeout_s=spec["timeout_s"])
    if verdict != DONE:
        return ItemOutcome(verdict)
    secrets = revealed_for(run.id)  # in memory for this call only (secret_inputs)
    step_input = secrets.reveal({**(item.step.input or {}), "item": item.item, "index": index})
    key = idempotency_key_for(run.id, item.step.name, f"item-{index}") if run.forked_from_id is None \
        else effect_key_of(run, item.step.name, f"item-{index}")
    trace = Trace(None)
    ctx = ExecContext(str(run.id), run.version.workflow.name, item.step.name, attempt, key,
                      step_id=item.step_id, scrub=secrets.scrub, fencing_token=attempt,
                      sandbox=run.sandbox,
                      effects=partial(effect_perform, step_id=item.step_id, key=key, fence=attempt,
                                      holds=lambda: _owned(item, attempt).exists(),
                                      scrub=secrets.scrub),
                      reserve_call=partial(_item_call_reserve, item=item, attempt=attempt),
                      settle_call=partial(_item_call_settle, item=item, attempt=attempt),
                      authorize=trace.authorize, responded=trace.responded, price=cost_of)
    try:
        with heartbeat(lambda: bool(_owned(item, attempt).update(lease_expires_at=lease_until())),
                       name=f"item-{item.id}"):
            result = execute(spec, step_input, ctx)
    except StepError as error:
        error.message = secrets.scrub(error.message)
        used = getattr(error, "spent", None)
        spent[0] = (used.tokens_in + used.tokens_out) if used is not None else 0
        return _attempt_failed(item, attempt, spec, error, spent=used)
    spent[0] = result.tokens_in + result.tokens_out
    # As a read of the saved row gives it back (JSON), since the join's check reads that.
    output = json.loads(json.dumps(secrets.scrub(result.output)))
    _finish(item, attempt, output=output, error=None, spent=result,
            attestation=_item_attestation(item, run, spec, attempt, output, result, trace))
    return ItemOutcome(DONE)


def _item_attestation(item: MapItem, run: Run, spec: dict, attempt: int, output, result,
                      trace: Trace) -> dict:
    """The record of an item's successful attempt, signed by this process: like a step's
    (`worker.Trace.record`), naming its item."""
    key_registered()
    route, route_model = answering_route(result.meta, result.provider, result.model)
    return attestation_sign({
        "step": item.step_id,
        "item": item.index,
        "run": str(run.id),
        "name": item.step.name,
        "kind": "map_item",
        "attempt": attempt,
        "fencing_token": attempt,
        "producer": f"worker:{process_label()}",
        "input": digest_of({**(item.step.input or {}), "item": item.item, "index": item.index}),
        "spec": digest_of(spec),
        "calls": trace.calls,
        "route": route,
        "route_model": route_model,
        "output": output_digest(output),
    })


def _take_slot(item: MapItem, run: Run, *, cap: int, timeout_s: int) -> tuple[str, int]:
    """Claim `item` under a lease if the run has fewer than `cap` items in flight and its
    budget holds the attempt.

    Returns (DONE, the attempt's number), (DEFERRED, 0) or (SKIPPED, 0): not due yet, leased
    by another worker — or by a dead one, which only the reaper may turn into a new attempt —
    or refused by the budget (the run is paused; once resumed, the reaper sends the item again).
    """
    at = now()
    with transaction.atomic():
        # The run's lock first: two workers counting the items in flight at once would both
        # see a free slot (PostgreSQL; SQLite's IMMEDIATE transactions serialize them anyway).
        run = lock_run(run.id)
        if _in_flight(run.id, at).exclude(id=item.id).count() >= cap:
            return DEFERRED, 0
        if run.state not in RUN_ADVANCING:
            return SKIPPED, 0
        attempt = MapItem.objects.values_list("attempts", flat=True).get(id=item.id) + 1
        definition, graph = definition_of(run)
        denial = dispatch_reserve(run, item.step, graph.steps[item.step.name], definition,
                                  attempt=attempt, items=[item.index])
        if denial:
            run_pause_for_budget(run, denial, actor=CHORD)
            return SKIPPED, 0
        taken = MapItem.objects.filter(
            id=item.id, done=False, lease_expires_at__isnull=True, due_at__lte=at + CLOCK_SKEW,
        ).update(attempts=F("attempts") + 1, claimed_at=at, deadline_at=at + timedelta(seconds=timeout_s),
                 lease_expires_at=lease_until(at))
        if not taken:
            return SKIPPED, 0
        return DONE, MapItem.objects.values_list("attempts", flat=True).get(id=item.id)


def _item_call_reserve(turn: int, *, item: MapItem, attempt: int) -> None:
    """Before an item attempt's repair `turn` is sent: reserve it like the attempt (run
    locked). Raises StepError `budget` when a limit would be crossed (the run is paused, the
    call not made), `lost` when the attempt no longer holds the item."""
    with transaction.atomic():
        run = lock_run(item.step.run_id)
        if not _owned(item, attempt).exists():
            raise StepError("lost", f"attempt {attempt} no longer holds item {item.index}")
        definition, graph = definition_of(run)
        denial = dispatch_reserve(run, item.step, graph.steps[item.step.name], definition,
                                  attempt=attempt, items=[item.index], turn=turn)
        if denial:
            run_pause_for_budget(run, denial, actor=CHORD)
    if denial:
        raise StepError("budget", denial["message"])


def _item_call_settle(turn: int, cost_usd: Decimal, *, item: MapItem, attempt: int) -> None:
    budget_settle(step_id=item.step_id, attempt=attempt, item=item.index, turn=turn, actual=cost_usd)


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


def _settle(item: MapItem, attempt: int, spent) -> None:
    budget_settle(step_id=item.step_id, attempt=attempt, item=item.index,
                  actual=spent.cost_usd if spent is not None else Decimal(0))


def _finish(item: MapItem, attempt: int, *, output, error: dict | None, spent,
            attestation: dict | None = None) -> None:
    _charge(item, spent)
    _settle(item, attempt, spent)
    _owned(item, attempt).update(done=True, finished_at=now(), output=output, error=error,
                                 attestation=attestation, lease_expires_at=None, deadline_at=None)


def _attempt_failed(item: MapItem, attempt: int, spec: dict, error: StepError, *, spent=None) -> ItemOutcome:
    """An attempt ended in `error`: the item's retry policy decides between another and done.
    An attempt stopped for the run's budget is neither: the item waits, due, and is sent again
    once the run is resumed (the reaper), without spending a retry."""
    at = now()
    if error.error_class == "budget":
        _charge(item, spent)
        _settle(item, attempt, spent)
        _owned(item, attempt).update(lease_expires_at=None, deadline_at=None, due_at=at,
                                     error=error.as_dict())
        return ItemOutcome(SKIPPED)
    when = retry_at(spec["retry"], attempts=attempt, error=error, at=at)
    if when is None:
        _finish(item, attempt, output=None, error=error.as_dict(), spent=spent)
        return ItemOutcome(DONE)
    _charge(item, spent)
    _settle(item, attempt, spent)
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
    step = StepRun.objects.only("name", "state").get(id=step_id)  # state: read as it loads (fsm)
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
            map_items_redispatch_on_commit(step_id, sends,
                                           batch_queue_for(spec, capacity=run.capacity))
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


def _unattested_items(step: StepRun, items: list[MapItem]) -> dict[int, str]:
    """Item index -> why its output may not be read, for each succeeded item whose record does
    not hold (engine/attestation.py)."""
    problems = {}
    for i in items:
        if i.error:
            continue
        problem = attestation_problem(step_id=step.id, output=i.output, attestation=i.attestation,
                                      item=i.index)
        if problem:
            problems[i.index] = problem
    return problems


def map_join(*, step_id: int, actor: Actor = CHORD) -> bool:
    """Join a map step once every item is done. False if it is not (yet) joinable."""
    with transaction.atomic():
        run, step = lock_run_of_step(step_id)
        if step.state != StepState.WAITING:
            return False
        items = list(step.map_items.order_by("index"))
        if not items or not all(i.done for i in items):
            return False
        problems = _unattested_items(step, items)
        if problems:
            # The join reads no item output whose record does not hold: the map waits, the run
            # pauses for an investigation.
            run_pause_for_attestation(run, {step.name: step}, {step.name: "; ".join(
                f"item {index}: {problem}" for index, problem in problems.items())}, actor=actor)
            return False
        _, graph = definition_of(run)
        output, error = merge(graph.steps[step.name]["merge"], items)
        usage = {k: sum((getattr(i, k) for i in items), start=Decimal(0) if k == "cost_usd" else 0)
                 for k in ("tokens_in", "tokens_out", "cost_usd")}
        for key, value in usage.items():
            setattr(step, key, getattr(step, key) + value)
            setattr(run, key, getattr(run, key) + value)
        run.save(update_fields=list(usage))
        step.waiting_for = ""  # why its items waited (a provider quota) no longer holds
        if error:
            step.fail(error=error)
        else:
            step.complete(output=output)
        step.save()
        event_record(run=run, step=step, kind=f"step.{step.state}", actor=label(actor),
                     payload={"items": len(items), "cost_usd": str(usage["cost_usd"]),
                              **({"error": error} if error else {})})
        step_ended(run, step, actor=actor)
    return True
