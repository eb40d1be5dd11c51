"""Agent steps on a worker: a model call held to its contract, repaired within a bound
(`executors.agent`).

What is particular to an agent: each repair turn of an attempt is a model call of its own for
budgets, reserved before it is made (`repair_reserve`, which pauses the run when a limit would be
crossed) and settled to its cost once it returns (`call_settle`). Claiming, the lease, the outcome
and retries are the machinery every worker kind shares (`worker`).
"""
from decimal import Decimal
from functools import partial

from django.db import transaction

from budgets.selectors import call_reservation
from budgets.services import budget_settle

from ...retry import StepError
from ...selectors import definition_of, lock_run_of_step
from ...states import StepKind
from ..budget_gate import dispatch_reserve, run_pause_for_budget
from . import register
from .worker import Claim, WorkerStep, fenced


class AgentStep(WorkerStep):
    def call_hooks(self, claim: Claim, *, scrub) -> dict:
        return {"reserve_call": partial(repair_reserve, step_id=claim.step_id, attempt=claim.attempt),
                "settle_call": partial(call_settle, step_id=claim.step_id, attempt=claim.attempt),
                "reserved": partial(_reserved, step_id=claim.step_id, attempt=claim.attempt)}


register(StepKind.AGENT, AgentStep())


def repair_reserve(turn: int, *, step_id: int, attempt: int) -> None:
    """Before an agent attempt's repair `turn` is sent to the model: reserve its projected cost
    against every level, like a dispatch (run locked). Raises StepError `budget` when a limit
    would be crossed — the run is paused then, the call is not made, and the step is held to
    run again once the run is resumed (`worker._fail_or_retry`) — or `lost` when this attempt no
    longer holds its step."""
    with transaction.atomic():
        run, step = lock_run_of_step(step_id)
        if not fenced(step, attempt):
            raise StepError("lost", "the attempt no longer holds its step")
        definition, graph = definition_of(run)
        denial = dispatch_reserve(run, step, graph.steps[step.name], definition, attempt=attempt, turn=turn)
        if denial:
            run_pause_for_budget(run, denial)
    # Raised after the commit: the pause and its alert stand, whatever the worker does next.
    if denial:
        raise StepError("budget", denial["message"])


def call_settle(turn: int, cost_usd: Decimal, *, step_id: int, attempt: int) -> None:
    """A model call of an attempt returned: settle its reservation to what it cost."""
    budget_settle(step_id=step_id, attempt=attempt, actual=cost_usd, turn=turn)


def _reserved(turn: int, *, step_id: int, attempt: int) -> Decimal | None:
    """What is reserved for a model call of an attempt: a costlier route must fit it."""
    return call_reservation(step_id=step_id, attempt=attempt, turn=turn)
