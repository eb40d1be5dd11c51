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

Fencing: a fenced caller passes its attempt's token (`fence`, the claim generation) and a
`holds()` check of its claim. The row records the token of the attempt that last started it;
an attempt whose claim was superseded may not start, restart or reconcile the effect (its
claim no longer holds, or the row carries a newer token), and its `_finish` is a conditional
UPDATE on its own token, so a worker resumed after its lease expired never overwrites the
outcome the newer attempt recorded.

A sandboxed run's call (`sandboxed`: `executors.tool.prepared_call` answered it from the run's
sandbox) goes through the ledger like any other, keyed, once, replayed and compensated as a live
one would be, so what an evaluation measures is what a live run does; the only difference is
that its `call` reaches nothing, and its outcome is recorded with a `step.sandboxed` event
saying what it would have done.
"""
from collections.abc import Callable

from django.db import IntegrityError, transaction

from orchestrator.integrations.tools.registry import Tool
from orchestrator.models import Effect, StepRun

from ..clock import now
from ..events import event_record
from ..retry import StepError
from ..states import RUN_EFFECTS_ALLOWED


def effect_perform(*, tool: Tool, call: Callable[[], object], step_id: int, key: str,
                   action: str = "default", fence: int = 0,
                   holds: Callable[[], bool] | None = None,
                   scrub: Callable[[object], object] = lambda v: v,
                   sandboxed: dict | None = None) -> object:
    """Perform `call` once for `key`, or return what the first time produced.

    `fence` and `holds` fence the caller (module docstring). What is stored of the outcome
    passes through `scrub` first (the run's secret inputs are masked: secret_inputs); the
    caller gets the result as the tool returned it. `sandboxed`: the call is a sandbox's answer,
    and this is what it would have done ({tool, params, response_declared}), recorded as
    `step.sandboxed` with its outcome.

    Raises StepError from the call, StepError("cancelled") if the run is being cancelled (the
    last safe point before the effect), StepError("uncertain") when a previous attempt's
    outcome cannot be reconciled, and StepError("stale") when the caller's claim was superseded.
    """
    effect, uncertain = _begin(step_id=step_id, key=key, tool=tool, action=action, fence=fence,
                               holds=holds)
    if uncertain:
        found = tool.lookup(key) if tool.lookup is not None else None  # outside any transaction
        effect = _reconciled(effect, tool, found, fence=fence)
    if effect.status == Effect.Status.SUCCEEDED:
        return effect.result
    try:
        result = call()
    except StepError as error:
        _finish(effect, status=Effect.Status.FAILED, error=scrub(error.as_dict()))
        raise
    _finish(effect, status=Effect.Status.SUCCEEDED, result=scrub(result),
            sandboxed=scrub(sandboxed) if sandboxed is not None else None)
    return result


def _stale(key: str, fence: int) -> StepError:
    return StepError("stale", f"attempt {fence} no longer holds its claim; effect {key} is "
                              "another attempt's")


def _begin(*, step_id: int, key: str, tool: Tool, action: str, fence: int,
           holds: Callable[[], bool] | None) -> tuple[Effect, bool]:
    """(the ledger row for `key`, whether its outcome is uncertain): created `started` for this
    attempt, already succeeded, restarted after a failure, or left `started` by an attempt
    that died during the call (uncertain: to reconcile before anything is called)."""
    with transaction.atomic():
        step = StepRun.objects.select_related("run").defer("input", "output").get(id=step_id)
        if step.run.state not in RUN_EFFECTS_ALLOWED:
            raise StepError("cancelled", f"run is {step.run.state}; the effect was not started")
        if holds is not None and not holds():
            raise _stale(key, fence)
        try:
            with transaction.atomic():
                effect = Effect.objects.create(key=key, run_id=step.run_id, step=step,
                                               action=action, tool=tool.name, fence=fence)
                event_record(run=step.run, step=step, kind="effect.started",
                             payload={"key": key, "tool": tool.name, "action": action})
                return effect, False
        except IntegrityError:
            effect = Effect.objects.select_for_update().get(key=key)
        if effect.fence > fence and effect.status != Effect.Status.SUCCEEDED:
            raise _stale(key, fence)  # a newer attempt owns it: never restart or reconcile it
        if effect.status == Effect.Status.SUCCEEDED:
            event_record(run=step.run, step=step, kind="effect.replayed",
                         payload={"key": key, "tool": tool.name})
            return effect, False
        if effect.status == Effect.Status.FAILED:
            _restart(effect, attempts=effect.attempts, fence=fence)
            return effect, False
        effect.attempts_seen = effect.attempts
        return effect, True


def _reconciled(effect: Effect, tool: Tool, found: object, *, fence: int) -> Effect:
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
        _restart(current, attempts=current.attempts, fence=fence)
        return current


def _restart(effect: Effect, *, attempts: int, fence: int) -> None:
    """Mark the effect started again for one more attempt, `fence`'s (inside the caller's
    transaction)."""
    Effect.objects.filter(id=effect.id).update(status=Effect.Status.STARTED, fence=fence,
                                               attempts=attempts + 1, error=None)
    effect.refresh_from_db()


def _finish(effect: Effect, *, status: str, result=None, error=None,
            sandboxed: dict | None = None) -> None:
    """Record the outcome, only if the row still carries this attempt's token (with
    `sandboxed`, the sandbox's answer: its `step.sandboxed` event too). Raises
    StepError("stale") when a newer attempt took the effect over meanwhile."""
    with transaction.atomic():
        if not Effect.objects.filter(id=effect.id, fence=effect.fence).exclude(
                status=Effect.Status.SUCCEEDED).update(status=status, result=result, error=error,
                                                       finished_at=now()):
            raise _stale(effect.key, effect.fence)
        step = StepRun.objects.select_related("run").get(id=effect.step_id)
        if sandboxed is not None:
            event_record(run=step.run, step=step, kind="step.sandboxed",
                         payload={**sandboxed, "key": effect.key, "action": effect.action})
        event_record(run=step.run, step=step, kind=f"effect.{status}",
                     payload={"key": effect.key, "tool": effect.tool, "action": effect.action,
                              **({"error": error} if error else {})})

