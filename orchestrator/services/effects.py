"""Exactly-once side effects: every effect goes through the idempotency ledger (`Effect`).

`effect_perform` runs a side-effecting call at most once per stable key:
- a key already `succeeded` returns the stored result (a replay, a redelivery, a redrive);
- a key left `started` means a worker died during the call and the outcome is uncertain; it is
  reconciled — the tool's `lookup(key)` says whether the effect happened, or the tool's remote
  dedupes by the key it is sent (`dedupes_by_key`) — and is never blindly repeated; with
  neither, the step fails as `uncertain` for a person to resolve;
- the `started` row is committed BEFORE the call, so a crash mid-call leaves the evidence.
The call itself runs outside any transaction.
"""
from collections.abc import Callable

from django.db import IntegrityError, transaction

from ..clock import now
from ..events import event_record
from ..models import Effect, Run, RunState, StepRun
from ..retry import StepError
from ..tools.registry import Tool

LIVE = (RunState.RUNNING, RunState.WAITING, RunState.COMPENSATING)


def effect_perform(*, step: StepRun, key: str, tool: Tool, call: Callable[[], object],
                   action: str = "default") -> object:
    """Perform `call` once for `key`, or return what the first time produced.

    Raises StepError from the call, StepError("cancelled") if the run is being cancelled (the
    last safe point before the effect), and StepError("uncertain") when a previous attempt's
    outcome cannot be reconciled.
    """
    effect = _begin(step=step, key=key, tool=tool, action=action)
    if effect.status == Effect.Status.SUCCEEDED:
        return effect.result
    try:
        result = call()
    except StepError as error:
        _finish(effect, status=Effect.Status.FAILED, error=error.as_dict())
        raise
    _finish(effect, status=Effect.Status.SUCCEEDED, result=result)
    return result


def _begin(*, step: StepRun, key: str, tool: Tool, action: str) -> Effect:
    with transaction.atomic():
        run_state = Run.objects.values_list("state", flat=True).get(id=step.run_id)
        if run_state not in LIVE:
            raise StepError("cancelled", f"run is {run_state}; the effect was not started")
        try:
            with transaction.atomic():
                effect = Effect.objects.create(key=key, run_id=step.run_id, step=step,
                                               action=action, tool=tool.name)
                event_record(run=step.run, step=step, kind="effect.started",
                             payload={"key": key, "tool": tool.name, "action": action})
                return effect
        except IntegrityError:
            effect = Effect.objects.select_for_update().get(key=key)
        if effect.status == Effect.Status.SUCCEEDED:
            event_record(run=step.run, step=step, kind="effect.replayed",
                         payload={"key": key, "tool": tool.name})
            return effect
        if effect.status == Effect.Status.STARTED:
            _reconcile(effect, tool)
            if effect.status == Effect.Status.SUCCEEDED:
                return effect
        Effect.objects.filter(id=effect.id).update(status=Effect.Status.STARTED,
                                                   attempts=effect.attempts + 1, error=None)
        effect.refresh_from_db()
        return effect


def _reconcile(effect: Effect, tool: Tool) -> None:
    """Decide an uncertain effect (inside _begin's transaction)."""
    step = effect.step
    if tool.lookup is not None:
        found = tool.lookup(effect.key)
        if found is not None:
            Effect.objects.filter(id=effect.id).update(status=Effect.Status.SUCCEEDED, result=found,
                                                       finished_at=now())
            effect.refresh_from_db()
            event_record(run=step.run, step=step, kind="effect.reconciled",
                         payload={"key": effect.key, "found": True})
            return
        event_record(run=step.run, step=step, kind="effect.reconciled",
                     payload={"key": effect.key, "found": False})
        return
    if tool.dedupes_by_key:
        event_record(run=step.run, step=step, kind="effect.reconciled",
                     payload={"key": effect.key, "by": "remote idempotency key"})
        return
    raise StepError("uncertain", f"effect {effect.key} may have happened; tool '{tool.name}' "
                                 "offers no lookup, so a person must reconcile it")


def _finish(effect: Effect, *, status: str, result=None, error=None) -> None:
    with transaction.atomic():
        Effect.objects.filter(id=effect.id).update(status=status, result=result, error=error,
                                                   finished_at=now())
        event_record(run=effect.step.run, step=effect.step, kind=f"effect.{status}",
                     payload={"key": effect.key, "tool": effect.tool, "action": effect.action,
                              **({"error": error} if error else {})})
