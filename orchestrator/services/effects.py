"""Exactly-once side effects: every effect goes through the idempotency ledger (`Effect`).

`effect_perform` runs a side-effecting call at most once per stable key:
- a key already `succeeded` returns the stored result (a replay, a redelivery, a redrive);
- a key left `started` means a worker died during the call and the outcome is uncertain; it is
  reconciled — the tool's `lookup(key)` says whether the effect happened, or the tool's remote
  dedupes by the key it is sent (`dedupes_by_key`) — and is never blindly repeated; with
  neither, the step fails as `uncertain` for a person to resolve;
- the `started` row is committed BEFORE the call, so a crash mid-call leaves the evidence.
The call, and a reconciling `lookup`, run outside any transaction: no row lock is held across
the network.
"""
from collections.abc import Callable

from django.db import IntegrityError, transaction

from ..clock import now
from ..events import event_record
from ..models import Effect, StepRun
from ..retry import StepError
from ..states import RUN_EFFECTS_ALLOWED
from ..tools.registry import Tool


def effect_perform(*, tool: Tool, call: Callable[[], object], step_id: int, key: str,
                   action: str = "default", scrub: Callable[[object], object] = lambda v: v) -> object:
    """Perform `call` once for `key`, or return what the first time produced.

    What is stored of the outcome passes through `scrub` first (the run's secret inputs are
    masked: secret_inputs); the caller gets the result as the tool returned it.

    Raises StepError from the call, StepError("cancelled") if the run is being cancelled (the
    last safe point before the effect), and StepError("uncertain") when a previous attempt's
    outcome cannot be reconciled.
    """
    effect, uncertain = _begin(step_id=step_id, key=key, tool=tool, action=action)
    if uncertain:
        found = tool.lookup(key) if tool.lookup is not None else None  # outside any transaction
        effect = _reconciled(effect, tool, found)
    if effect.status == Effect.Status.SUCCEEDED:
        return effect.result
    try:
        result = call()
    except StepError as error:
        _finish(effect, status=Effect.Status.FAILED, error=scrub(error.as_dict()))
        raise
    _finish(effect, status=Effect.Status.SUCCEEDED, result=scrub(result))
    return result


def _begin(*, step_id: int, key: str, tool: Tool, action: str) -> tuple[Effect, bool]:
    """(the ledger row for `key`, whether its outcome is uncertain): created `started` for this
    attempt, already succeeded, restarted after a failure, or left `started` by an attempt
    that died during the call (uncertain: to reconcile before anything is called)."""
    with transaction.atomic():
        step = StepRun.objects.select_related("run").defer("input", "output").get(id=step_id)
        if step.run.state not in RUN_EFFECTS_ALLOWED:
            raise StepError("cancelled", f"run is {step.run.state}; the effect was not started")
        try:
            with transaction.atomic():
                effect = Effect.objects.create(key=key, run_id=step.run_id, step=step,
                                               action=action, tool=tool.name)
                event_record(run=step.run, step=step, kind="effect.started",
                             payload={"key": key, "tool": tool.name, "action": action})
                return effect, False
        except IntegrityError:
            effect = Effect.objects.select_for_update().get(key=key)
        if effect.status == Effect.Status.SUCCEEDED:
            event_record(run=step.run, step=step, kind="effect.replayed",
                         payload={"key": key, "tool": tool.name})
            return effect, False
        if effect.status == Effect.Status.FAILED:
            _restart(effect, attempts=effect.attempts)
            return effect, False
        effect.attempts_seen = effect.attempts
        return effect, True


def _reconciled(effect: Effect, tool: Tool, found: object) -> Effect:
    """Decide an uncertain effect with what `lookup` found (None: not found, or no lookup)."""
    with transaction.atomic():
        current = Effect.objects.select_for_update().select_related("step__run").get(id=effect.id)
        if current.attempts != effect.attempts_seen or current.status != Effect.Status.STARTED:
            # Another worker reconciled or restarted it while we looked: take its verdict.
            if current.status == Effect.Status.SUCCEEDED:
                return current
            raise StepError("transient", f"effect {effect.key} is being performed by another attempt")
        step, run = current.step, current.step.run
        if tool.lookup is not None:
            if found is not None:
                Effect.objects.filter(id=current.id).update(status=Effect.Status.SUCCEEDED,
                                                            result=found, finished_at=now())
                current.refresh_from_db()
                event_record(run=run, step=step, kind="effect.reconciled",
                             payload={"key": current.key, "found": True})
                return current
            event_record(run=run, step=step, kind="effect.reconciled",
                         payload={"key": current.key, "found": False})
        elif tool.dedupes_by_key:
            event_record(run=run, step=step, kind="effect.reconciled",
                         payload={"key": current.key, "by": "remote idempotency key"})
        else:
            raise StepError("uncertain", f"effect {current.key} may have happened; tool "
                                         f"'{tool.name}' offers no lookup, so a person must reconcile it")
        _restart(current, attempts=current.attempts)
        return current


def _restart(effect: Effect, *, attempts: int) -> None:
    """Mark the effect started again for one more attempt (inside the caller's transaction)."""
    Effect.objects.filter(id=effect.id).update(status=Effect.Status.STARTED,
                                               attempts=attempts + 1, error=None)
    effect.refresh_from_db()


def _finish(effect: Effect, *, status: str, result=None, error=None) -> None:
    with transaction.atomic():
        Effect.objects.filter(id=effect.id).update(status=status, result=result, error=error,
                                                   finished_at=now())
        step = StepRun.objects.select_related("run").get(id=effect.step_id)
        event_record(run=step.run, step=step, kind=f"effect.{status}",
                     payload={"key": effect.key, "tool": effect.tool, "action": effect.action,
                              **({"error": error} if error else {})})

