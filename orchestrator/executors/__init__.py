"""Executors: run one step (or one map item) and return its output, or raise StepError.

They perform the side effects — model calls, tool calls — and never change persisted state;
the step services commit what they return. Each validates what it returns against the step's
output_schema, so malformed output is a classified failure, never data flowing on.
"""
from dataclasses import dataclass
from decimal import Decimal

from ..retry import StepError


@dataclass(frozen=True)
class ExecContext:
    run_id: str
    workflow: str
    step_name: str
    attempt: int
    idempotency_key: str
    step_id: int = 0


@dataclass(frozen=True)
class Result:
    output: object
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: Decimal = Decimal("0")
    model: str = ""
    provider: str = ""


def execute(spec: dict, step_input: dict, ctx: ExecContext) -> Result:
    """Run `spec` on `step_input`. Raises StepError for every failure."""
    from . import agent, router, tool

    runners = {"agent": agent.run, "tool": tool.run, "router": router.run}
    try:
        runner = runners[spec["type"]]
    except KeyError:
        raise StepError("permanent", f"steps of type '{spec['type']}' are not run by a worker") from None
    return runner(spec, step_input, ctx)


__all__ = ["ExecContext", "Result", "StepError", "execute"]
