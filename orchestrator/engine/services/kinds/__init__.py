"""Step kinds: one module each, owning everything that is particular to its kind.

- `agent`, `tool`, `router`: the steps a worker runs — queued, claimed by a worker under a
  lease, executed, retried under their policy, on the machinery they share (`worker`);
- `human_gate`: opens an approval request and waits; approval decisions;
- `sub_workflow`: starts a child run and waits for it;
- `map_step`: fans items out as a Celery chord and joins them;
- `loop`: runs its body's steps once per iteration until its condition holds, at most
  `max_iterations` times;
- `sleep`: waits until a time, which the reaper wakes it at;
- `human_input`: opens an input task (a form for a group) and waits for its answer;
- `wait`: waits for a named signal (`services.signals`), until its timeout.

A kind module implements `StepKindHandler` and registers it here. The scheduler starts a step,
the reaper times one out or stops it and `step_end` releases what an ended step owned only through this
registry, so they never import a kind module (which imports them): the import graph stays
one-way. `orchestrator.engine.services` imports every kind module, which registers it.
"""
from collections.abc import Callable
from typing import Protocol

from orchestrator.models import Run, StepRun

# record(step, kind, payload, actor=None): adds the step to the scheduler's batch, and its event
# to the batch's one INSERT (by `actor`, a label; the scheduler's actor when None).
Record = Callable[..., None]


class Eager(Protocol):
    """A worker offering to run, itself and next, one of the steps the transaction it commits
    starts (eager dispatch: `worker.Carry`). `run_advance` offers it each step it starts until
    one is taken, and returns what was taken."""

    def takes(self, queue: str) -> bool:
        """Whether it may take one more step from `queue`."""


class StepKindHandler:
    """What the engine asks of a step kind. Every method runs inside the caller's transaction,
    with the run row locked."""

    # Whether `start` writes ledger entries of its own, outside the scheduler's batch (a child
    # run's): the events that led to the start are then written before them.
    records_outside_the_batch = False

    def start(self, run: Run, step: StepRun, spec: dict, record: Record) -> None:
        """Move a ready step on: queue it for a worker, or start waiting for its event."""
        raise NotImplementedError

    def start_offered(self, run: Run, step: StepRun, spec: dict, record: Record,
                      eager: Eager) -> object | None:
        """`start`, offering the step to `eager`: what that worker took (a claim of the step,
        which it runs next with no message), or None. Only a kind a worker runs is taken."""
        self.start(run, step, spec, record)
        return None

    def time_out(self, *, step_id: int, reason: str) -> bool:
        """The reaper's verdict on a step past its deadline (in a transaction of its own).
        False if the step had moved on already."""
        raise NotImplementedError

    def stop(self, run: Run, step: StepRun, *, reason: str, hold: bool, actor) -> bool:
        """Stop the step while it runs, for its run's budget (the run is past its duration):
        held to run again once the run resumes (`hold`), or cancelled. False if this kind has
        nothing running to stop: it stops at its next safe point, as the run is no longer
        advancing."""
        return False

    def release(self, run: Run, step: StepRun, *, actor) -> None:
        """The step ended other than completed: stop everything it owns (an open approval, a
        child run, map items still to run), so nothing it started acts afterwards."""

    def progress(self, run: Run, step: StepRun, verdict: str, detail: dict, *, actor) -> None:
        """The scheduler's verdict on a waiting step that owns steps of the run (a loop whose
        iteration ended: "next", "complete" or "fail"), applied in the caller's transaction."""
        raise NotImplementedError


_HANDLERS: dict[str, StepKindHandler] = {}


def register(kind: str, handler: StepKindHandler) -> StepKindHandler:
    _HANDLERS[kind] = handler
    return handler


def handler_for(kind: str) -> StepKindHandler:
    """Raises KeyError for a kind no module registered."""
    return _HANDLERS[kind]
