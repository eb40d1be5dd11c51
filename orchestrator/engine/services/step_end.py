"""What happens after a step ends: the one path every step kind takes, for every way it ends.

Called inside the transaction that ended the step, with the run row locked. A step that did not
complete (failed, timed out, cancelled) first has what it owns released by its kind — an open
approval, a child run, map items still to run — so nothing it started acts afterwards. Then the
run moves on: a cancelling run settles, any other is advanced by the scheduler.
"""
from collections.abc import Sequence

from django.db import transaction

from budgets.services import budget_release, model_calls
from orchestrator.models import Event, Run, StepRun
from orchestrator.store import save_row

from ..authz import REAPER, Actor, label
from ..events import event_record, events_record
from ..selectors import lock_run_of_step, spec_of
from ..states import RunState, StepState
from .attestations import output_attest
from .kinds import Eager, handler_for
from .scheduling import run_advance, run_settle_cancel
from .step_concurrency import held_steps_release


def step_ended(run: Run, step: StepRun, *, actor: Actor, pending: Sequence[Event] = (),
               steps: Sequence[StepRun] | None = None, eager: Eager | None = None) -> object | None:
    """`step` has just reached a terminal state: release what it owns, then move the run on.

    `pending`: the events of the step's end not yet written (`events.Event` instances, unsaved):
    they are written before anything that follows, batched with the run's next transitions.
    `steps`: the run's steps as the caller holds them, `step` among them, for the scheduler
    (`run_advance`); only for a completed step, whose end changes no other step.
    `eager`: the worker that ended it, offering to run a next step itself (`run_advance`).
    Returns what it took, else None.
    """
    if step.state == StepState.COMPLETED and step.attestation is None:
        # Not a worker's attempt (those are signed with the output): this process produced it.
        output_attest(run, step, producer=label(actor))
        save_row(step, ["attestation"])
    if pending and (step.state not in (StepState.COMPLETED, StepState.SKIPPED)
                    or run.state == RunState.CANCELLING):
        events_record(list(pending))
        pending = ()
    if step.state not in (StepState.COMPLETED, StepState.SKIPPED):
        handler_for(step.kind).release(run, step, actor=actor)
    if may_hold_reservations(run, step):
        budget_release(step_id=step.id)  # what it reserved and never spent
    if step.concurrency_key:  # the next steps of its key take their turn
        held_steps_release(run, step)
    if run.state == RunState.CANCELLING:
        run_settle_cancel(run, actor=actor)
        return None
    # What a release did to other steps is not in the caller's instances: read them again.
    held = steps if step.state == StepState.COMPLETED else None
    return run_advance(run, actor=actor, pending=pending, steps=held, eager=eager)


def may_hold_reservations(run: Run, step: StepRun) -> bool:
    """Whether `step` can hold budget reservations: only a step that calls a model (an agent, an
    LLM router, a map of either) is ever reserved for (`budgets.services.model_calls`, the
    test `budget_reserve` makes), so the others are spared two UPDATEs that match nothing."""
    try:
        return model_calls(spec_of(run, step.name)) is not None
    except KeyError:  # not a step of the run's definition: release, to be safe
        return True


def waiting_step_time_out(*, step_id: int, reason: str) -> bool:
    """Time out a step that waits for an event (a gate, a child run, a map's join).

    False if it no longer waits (it ended, or the event came first).
    """
    with transaction.atomic():
        run, step = lock_run_of_step(step_id)
        if step.state != StepState.WAITING:
            return False
        step.time_out(error={"class": "timeout", "message": reason})
        save_row(step)
        event_record(run=run, step=step, kind="step.timed_out", actor=label(REAPER),
                     payload=step.error)
        step_ended(run, step, actor=REAPER)
    return True
