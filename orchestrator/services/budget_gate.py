"""The budget gate every dispatch of a model call passes: reserve, or pause the run.

`dispatch_reserve` is called, in the transaction that dispatches and with the run row locked,
before a step's first attempt (`scheduling.run_advance`), a retry (`kinds.worker`), a map
item's attempt (`kinds.map_step`) and an operator's retry or redrive (`kinds.worker.step_requeue`).
A loop step reserves each iteration the same way (`items=[iteration]`). It reserves the call's
projected cost against every level (`budgets.services.budget_reserve`), alerts once when a level
passes its warning fraction, and on a denial alerts and returns the run's pause reason —
nothing is reserved then, and the caller does not dispatch.

`run_pause_for_budget` pauses a run for such a reason from outside the scheduler.
"""
from budgets.alerts import budget_alert
from budgets.services import budget_reserve, elapsed_denial

from ..authz import SCHEDULER, Actor, label
from ..events import event_record
from ..models import Run, StepRun
from ..states import RunState


def dispatch_reserve(run: Run, step: StepRun, spec: dict, definition: dict, *, attempt: int,
                     items: list[int] | None = None) -> dict | None:
    """Reserve one dispatch of `step` (its `attempt`, or one call per map item in `items`).
    Returns None when it may go, else the `budget` error to pause the run with."""
    late = elapsed_denial(run=run, definition=definition, step=step.name)
    if late:
        budget_alert(kind="budget.denied", run=run, key=f"run:{run.id}:run.duration",
                     level="run.duration", message=late["message"])
        return late
    reserved = budget_reserve(run=run, step=step, spec=spec, definition=definition,
                              attempt=attempt, items=items)
    for level in reserved.warnings:
        budget_alert(kind="budget.warning", run=run, key=f"{level.key}:warn", level=level.name,
                     message=f"${level.committed:.4f} of ${level.limit:.2f} was committed before "
                             f"step '{step.name}'; at least {level.warn_at:.0%} of the limit is now held.")
    denial = reserved.denial
    if denial is None:
        return None
    budget_alert(kind="budget.denied", run=run, key=f"run:{run.id}:{denial.level}:{denial.limit}",
                 level=denial.level, message=denial.message)
    return denial.as_error()


def run_pause_for_budget(run: Run, error: dict, *, actor: Actor = SCHEDULER) -> bool:
    """Pause a running or waiting run because a dispatch was refused (caller's transaction,
    run locked). False if the run is in no state to pause (it ended, or is paused already)."""
    if run.state not in (RunState.RUNNING, RunState.WAITING):
        return False
    run.pause(reason=error)
    run.save()
    event_record(run=run, kind="run.paused", actor=label(actor), payload=error)
    return True
