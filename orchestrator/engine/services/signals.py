"""Signals: a named JSON payload sent to a run, which a wait step of the run waits for.

`signal_send` is what the API and the Python client call; `signal_deliver` is the same state
change for a caller that holds the run's lock already (a trigger's correlated event, through
`correlated_step`). Each send is kept as one `Signal` row per (run, name, key), under that
unique constraint: a send repeated with its key returns the first one's result and changes
nothing, so a signal completes a step exactly once however often it is delivered.

A signal completes the wait step that waits for its name (the first in the definition's order),
with its payload, checked against that step's `schema`, as the step's output. When none waits
yet, the step that will wait for it decides (`early_signals`): it is buffered — at most
MAX_BUFFERED_SIGNALS per run — and consumed, oldest first, when that step starts
(`signal_take`, from `kinds.wait`), or refused. A signal no step of the run's definition waits
for, or for a run that has ended, is refused. Refusals raise and change nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction

from orchestrator.models import Run, Signal, StepRun
from orchestrator.store import build_row, insert_rows, save_row

from ..authz import Action, Actor, label, require
from ..clock import now
from ..definitions.limits import MAX_BUFFERED_SIGNALS, MAX_SIGNAL_KEY_CHARS, signal_payload_problems
from ..errors import IdempotencyConflict, InputInvalid, NotAllowed
from ..events import event_record
from ..selectors import definition_of, lock_run
from ..states import RUN_TERMINAL, StepKind, StepState
from .runs import input_problems
from .step_end import step_ended


@dataclass(frozen=True)
class SignalOutcome:
    """What became of a signal: `consumed` (a wait step completed with it) or `buffered`;
    `duplicate` when its key had been sent already (nothing changed)."""

    signal: Signal
    duplicate: bool = False

    @property
    def status(self) -> str:
        return self.signal.state


def signal_send(*, run_id, name: str, payload: object, key: str, actor: Actor,
                origin: dict | None = None) -> SignalOutcome:
    """Send the signal `name` with `payload` to run `run_id`, once per `key`.

    Raises Run.DoesNotExist; Forbidden without run.signal in the run's team; InputInvalid for a
    payload that is not an object, exceeds the limits or fails the waiting step's schema
    (paths `payload...`); IdempotencyConflict for a key sent before with another payload;
    NotAllowed when the run has ended, no step of it waits for `name`, or the signal would be
    buffered and the step refuses early signals or the run keeps as many as it may.
    """
    with transaction.atomic():
        run = lock_run(run_id)
        require(actor, Action.RUN_SIGNAL, team=run.team)
        return signal_deliver(run, name=name, payload=payload, key=key, actor=actor,
                              origin=origin or {"via": "api"})


def signal_deliver(run: Run, *, name: str, payload: object, key: str, actor: Actor,
                   origin: dict) -> SignalOutcome:
    """`signal_send` for a caller that holds `run`'s lock in its transaction and has checked
    who sends it. Raises as `signal_send` does."""
    if not key or len(key) > MAX_SIGNAL_KEY_CHARS:
        raise InputInvalid("the key is missing or too long", [
            {"path": "key", "message": f"must be 1 to {MAX_SIGNAL_KEY_CHARS} characters"}])
    existing = Signal.objects.filter(run=run, name=name, key=key).first()
    if existing is not None:
        if existing.payload != payload:
            raise IdempotencyConflict(
                f"signal '{name}' with key '{key}' was sent to this run with another payload",
                [{"path": "key", "message": "already used with another payload"}])
        return SignalOutcome(existing, duplicate=True)
    definition, graph = definition_of(run)
    declaring = [s["name"] for s in definition["steps"]
                 if s["type"] == StepKind.WAIT and s["signal"] == name]
    if not declaring:
        raise NotAllowed(f"no step of run {run.id} waits for signal '{name}'",
                         [{"path": "name", "message": f"no wait step for signal '{name}'"}])
    if run.state in RUN_TERMINAL:
        raise NotAllowed(f"run {run.id} has ended ({run.state}): it takes no signal",
                         [{"path": "", "message": f"the run is {run.state}"}])
    if not isinstance(payload, dict):
        raise InputInvalid("the payload must be a JSON object",
                           [{"path": "payload", "message": "must be a JSON object"}])
    if problems := signal_payload_problems(payload):
        raise InputInvalid("the payload exceeds the limits", problems)
    steps = {s.name: s for s in StepRun.objects.filter(run=run, name__in=declaring)}
    waiting = [steps[n] for n in declaring if n in steps and steps[n].state == StepState.WAITING]
    coming = [steps[n] for n in declaring
              if n in steps and steps[n].state in (StepState.BLOCKED, StepState.READY)]
    step = (waiting or coming or [None])[0]
    if step is None:
        raise NotAllowed(f"no step of run {run.id} waits for signal '{name}' any more",
                         [{"path": "name", "message": "every wait step for it has ended"}])
    spec = graph.steps[step.name]
    _check_payload(spec, payload)
    sent_by = label(actor)
    if step.state == StepState.WAITING:
        signal = _insert(run=run, name=name, key=key, payload=payload, state=Signal.State.CONSUMED,
                         step=step, sent_by=sent_by, origin=origin, consumed_at=now())
        step.complete(output=payload)
        save_row(step)
        event_record(run=run, step=step, kind="step.completed", actor=sent_by, payload={
            "signal": name, "key": key, "output": payload})
        step_ended(run, step, actor=actor)
        return SignalOutcome(signal)
    if spec["early_signals"] != "buffer":
        raise NotAllowed(f"step '{step.name}' does not wait for signal '{name}' yet, and refuses "
                         "a signal sent before it waits (early_signals: refuse)",
                         [{"path": "name", "message": f"step '{step.name}' is not waiting yet"}])
    kept = Signal.objects.filter(run=run, state=Signal.State.BUFFERED).count()
    if kept >= MAX_BUFFERED_SIGNALS:
        raise NotAllowed(f"run {run.id} already keeps {kept} signals no step has taken "
                         f"(at most {MAX_BUFFERED_SIGNALS}, docs/limits.md)",
                         [{"path": "", "message": "too many buffered signals"}])
    signal = _insert(run=run, name=name, key=key, payload=payload, state=Signal.State.BUFFERED,
                     sent_by=sent_by, origin=origin)
    event_record(run=run, kind="signal.buffered", actor=sent_by,
                 payload={"signal": name, "key": key, "for": step.name})
    return SignalOutcome(signal)


def _insert(**fields) -> Signal:
    signal = build_row(Signal, **fields)
    insert_rows([signal])
    return signal


def _check_payload(spec: dict, payload: dict) -> None:
    schema = spec.get("schema")
    if schema is None:
        return
    problems = [{**p, "path": "payload" + p["path"].removeprefix("input")}
                for p in input_problems(schema, payload)]
    if problems:
        raise InputInvalid(f"the payload does not satisfy the schema of step '{spec['name']}'",
                           problems)


def signal_take(run: Run, step: StepRun, spec: dict) -> Signal | None:
    """The oldest buffered signal for wait step `step` (which is starting, its run locked),
    marked consumed by it; None when there is none. In the caller's transaction."""
    signal = (Signal.objects.filter(run=run, name=spec["signal"], state=Signal.State.BUFFERED)
              .order_by("id").first())
    if signal is None:
        return None
    signal.state, signal.step, signal.consumed_at = Signal.State.CONSUMED, step, now()
    save_row(signal, ["state", "step", "consumed_at"])
    return signal


def correlated_step(*, workflow_id: int, key: str) -> StepRun | None:
    """The wait step of `workflow_id` that waits with correlation key `key` (the one that
    started first), or None. Read without a lock: the caller locks its run and checks again."""
    return (StepRun.objects.filter(state=StepState.WAITING, kind=StepKind.WAIT,
                                   correlation_key=key, run__version__workflow_id=workflow_id)
            .order_by("started_at", "id").select_related("run").first())
