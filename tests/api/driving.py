"""Test helpers that push a support run forward through the services, as a worker would.

No worker runs in API tests (on_commit callbacks never fire inside the test transaction), so
these claim and complete steps with the same services a worker calls.
"""
from orchestrator.engine.services.kinds.worker import Usage, step_claim, step_succeed
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Run, StepState
from tests.factories import example_definition

SUPPORT_INPUT = {"ticket_id": "T-1", "body": "I want a refund", "customer_email": "a@example.com"}

# What each step before the gate returns when "run" by the test's worker.
SUPPORT_OUTPUTS = {
    "classify": {"category": "billing", "urgency": "high"},
    "research": {"findings": "Refunds are allowed within 30 days."},
    "fetch_history": {"previous_tickets": []},
    "draft": {"subject": "Re: ticket T-1", "reply": "Your refund is on its way."},
}


def support_run(team, user) -> Run:
    version, _ = workflow_save(team=team, definition=example_definition("support"), actor=user)
    return run_start(version=version, input=SUPPORT_INPUT, actor=user)


def drive_to_gate(run: Run) -> Run:
    """Complete every queued step of `run` until none is left (the gate is then waiting)."""
    while True:
        queued = list(run.steps.filter(state=StepState.QUEUED))
        if not queued:
            return Run.objects.get(pk=run.pk)
        for step in queued:
            claim = step_claim(step_id=step.id, worker="test-worker")
            step_succeed(step_id=step.id, attempt=claim.attempt, output=SUPPORT_OUTPUTS[step.name],
                         usage=Usage(tokens_in=10, tokens_out=5), worker="test-worker")
