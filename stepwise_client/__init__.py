"""A small typed Python client for the Stepwise REST API.

    from stepwise_client import Stepwise

    stepwise = Stepwise("http://127.0.0.1:8000", token="...")
    run = stepwise.start("support-reply", {"ticket_id": "T-1", ...}, idempotency_key="T-1")
    run = stepwise.wait(run.id, until={"waiting"})
    reviewer = Stepwise("http://127.0.0.1:8000", token="...")   # not the run's starter
    reviewer.approve(reviewer.pending_approvals(run.id)[0], note="ok")
    run = stepwise.wait(run.id)

It talks HTTP only (httpx) and imports nothing of the server, so it can be copied into any
program. See docs/triggers.md#programmatic. Workflows can be written in Python with
`stepwise_client.builder.Workflow` and saved with `Stepwise.save_workflow` (docs/definitions.md).
"""
from .builder import Workflow
from .client import (
    TERMINAL_STATES,
    Approval,
    Firing,
    InputTask,
    Run,
    Signal,
    Stepwise,
    StepwiseError,
    WaitTimeout,
)

__all__ = ["TERMINAL_STATES", "Approval", "Firing", "InputTask", "Run", "Signal", "Stepwise",
           "StepwiseError", "WaitTimeout", "Workflow"]
