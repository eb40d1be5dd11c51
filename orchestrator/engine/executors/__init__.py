"""Executors: run one step (or one map item) and return its output, or raise StepError.

They perform the side effects — model calls, tool calls — and never change persisted state;
the step services commit what they return. Executors import no service: what they need of one
comes in the `ExecContext` the calling service fills in — the effect ledger a side-effecting
tool call goes through (`effects`), the ledger entry authorizing each external call
(`authorize`), the price of a model call (`price`), the budget's reservations. Each validates
what it returns against the step's output_schema, so malformed output is a classified failure,
never data flowing on.
"""
from ..retry import StepError
from . import agent, router, tool
from .base import ATTEMPT_META_FIELDS, ExecContext, Result, SpentStepError

RUNNERS = {"agent": agent.run, "tool": tool.run, "router": router.run}


def execute(spec: dict, step_input: dict, ctx: ExecContext) -> Result:
    """Run `spec` on `step_input`. Raises StepError for every failure."""
    try:
        runner = RUNNERS[spec["type"]]
    except KeyError:
        raise StepError("permanent", f"steps of type '{spec['type']}' are not run by a worker") from None
    return runner(spec, step_input, ctx)


__all__ = ["ATTEMPT_META_FIELDS", "ExecContext", "Result", "SpentStepError", "StepError", "execute"]
