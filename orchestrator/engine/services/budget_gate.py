"""The budget gate every dispatch of a model call passes: reserve, or pause the run.

`dispatch_reserve` is called, in the transaction that dispatches and with the run row locked,
before a step's first attempt (`scheduling.run_advance`), a retry (`kinds.worker`), a map
item's attempt (`kinds.map_step`), an operator's retry or redrive (`kinds.worker.step_requeue`)
and an agent attempt's repair turn (`kinds.agent.repair_reserve`, from the worker mid-attempt).
A loop step reserves each iteration the same way (`items=[iteration]`). It reserves the call's
projected cost against every level (`budgets.services.budget_reserve`) and returns None, or on a
denial the run's pause reason — nothing is reserved then, and the caller does not dispatch. What
people are told of — a level past its warning fraction, a denial — it records once per run and
level as an outbox event (`budget.warning`, `budget.denied`), from which alert detection raises
the alert (`alerts.detection`, `budgets.alerts`).

`duration_denial` is the same check for the run's wall-clock limit alone (the reaper's, for a run
past its deadline). `run_pause_for_budget` pauses a run for such a reason from outside the
scheduler.
"""
from budgets.alerts import budget_outcome_first
from budgets.services import budget_reserve, elapsed_denial
from orchestrator.models import Run, StepRun

from ..authz import SCHEDULER, Actor, label
from ..events import event_record
from ..states import RunState


def dispatch_reserve(run: Run, step: StepRun, spec: dict, definition: dict, *, attempt: int,
                     items: list[int] | None = None, turn: int = 0) -> dict | None:
    """Reserve one dispatch of `step` (its `attempt`, or one call per map item in `items`, or
    the attempt's repair `turn`). Returns None when it may go, else the `budget` error to
    pause the run with."""
    late = duration_denial(run, definition, step=step.name)
    if late:
        return late
    reserved = budget_reserve(run=run, step=step, spec=spec, definition=definition,
                              attempt=attempt, items=items, turn=turn)
    for level in reserved.warnings:
        _tell(kind="budget.warning", run=run, key=f"{level.key}:warn", level=level.name,
              message=f"${level.committed:.4f} of ${level.limit:.2f} was committed before "
                      f"step '{step.name}'; at least {level.warn_at:.0%} of the limit is now held.")
    denial = reserved.denial
    if denial is None:
        return None
    _tell(kind="budget.denied", run=run, key=f"run:{run.id}:{denial.level}:{denial.limit}",
          level=denial.level, message=denial.message)
    return denial.as_error()


def duration_denial(run: Run, definition: dict, *, step: str = "") -> dict | None:
    """The run's `budget` error when it is past its duration limit (alerted once per limit),
    else None."""
    late = elapsed_denial(run=run, definition=definition, step=step)
    if late:
        _tell(kind="budget.denied", run=run, key=f"run:{run.id}:run.duration:{late['limit_s']}",
              level="run.duration", message=late["message"])
    return late


def _tell(*, kind: str, run: Run, key: str, level: str, message: str) -> None:
    """Record a budget outcome people are told of as an outbox event, the first time it is seen
    (`budgets.alerts`): alert detection raises the alert from it."""
    if budget_outcome_first(kind=kind, key=key):
        event_record(run=run, kind=kind, actor=label(SCHEDULER),
                     payload={"key": key, "level": level, "message": message})


def run_pause_for_budget(run: Run, error: dict, *, actor: Actor = SCHEDULER) -> bool:
    """Pause a running or waiting run because a dispatch was refused (caller's transaction,
    run locked). False if the run is in no state to pause (it ended, or is paused already)."""
    if run.state not in (RunState.RUNNING, RunState.WAITING):
        return False
    run.pause(reason=error)
    run.save()
    event_record(run=run, kind="run.paused", actor=label(actor), payload=error)
    return True
