"""Sandboxed evaluation runs end to end through real Celery worker processes: the refund example
(scripted model) decided by its sandbox, on the evaluation queues, touching neither the refund
ledger nor the outbox; and a side-effecting HTTP call that reaches a local sink live and does
not when sandboxed."""
import pytest

from approvals.models import ApprovalRequest
from examples.tools import outbox_path, refunds_path
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, StepRun
from tests.factories import SETUP, example_definition
from tests.support.http_sink import HttpSink

from .conftest import wait_for_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ENDED = ("completed", "failed", "cancelled", "timed_out", "compensation_failed")
REFUNDED = {"refund_id": "rf_sandbox", "amount_usd": 1200.0, "duplicate": False}


def written(path) -> str:
    return path.read_text() if path.exists() else ""


def steps_of(run_id) -> dict[str, StepRun]:
    return {s.name: s for s in StepRun.objects.filter(run_id=run_id)}


def refund_run(team, message: str, **sandbox):
    version, _ = workflow_save(team=team, definition=example_definition("refund-proposal"),
                               actor=SETUP)
    return run_start(version=version, input={"order_id": "ORD-1002", "message": message},
                     actor=SETUP, capacity="evaluation",
                     sandbox={"purpose": "evaluation", "responses": {}, "decisions": {}, **sandbox})


def test_a_sandboxed_refund_is_approved_by_its_sandbox_and_refunds_nothing(workers, team):
    refunds, outbox = written(refunds_path()), written(outbox_path())

    run = refund_run(team, "My parcel never arrived.", responses={"refund": REFUNDED})
    run = wait_for_run(run.id, states=ENDED, timeout=60)

    assert run.state == "completed", run.error
    steps = steps_of(run.id)
    assert {n: s.state for n, s in steps.items()} == {
        "order": "completed", "propose": "completed", "approve": "completed",
        "refund": "completed", "reply": "skipped"}
    assert {n: steps[n].queue for n in ("order", "propose", "refund")} == {
        "order": "tools.evaluation", "propose": "agent.fast.evaluation",
        "refund": "tools.evaluation"}
    assert steps["approve"].started_at is not None
    assert steps["approve"].output["decided_by"] == "evaluation"
    assert steps["refund"].output == REFUNDED
    sandboxed = Event.objects.get(run_id=run.id, kind="step.sandboxed")
    assert sandboxed.step.name == "refund" and sandboxed.payload["response_declared"] is True
    assert sandboxed.payload["params"]["amount_usd"] == "1200.0"
    assert sandboxed.payload["params"]["proposal_hash"] == steps["approve"].output["proposal_hash"]
    assert ApprovalRequest.objects.get(run_id=run.id).state == "approved"
    assert (written(refunds_path()), written(outbox_path())) == (refunds, outbox)


def test_a_sandboxed_refund_rejected_by_its_sandbox_fails_and_refunds_nothing(workers, team):
    refunds = written(refunds_path())

    run = refund_run(team, "My parcel never arrived.", decisions={"approve": "reject"})
    run = wait_for_run(run.id, states=ENDED, timeout=60)

    assert run.state == "failed"
    steps = steps_of(run.id)
    assert steps["approve"].state == "failed" and steps["approve"].error["class"] == "rejected"
    assert steps["refund"].state != "completed"
    assert not Event.objects.filter(run_id=run.id, kind="step.sandboxed").exists()
    assert written(refunds_path()) == refunds


def test_a_side_effecting_call_reaches_the_sink_live_and_not_when_sandboxed(workers, team):
    with HttpSink() as sink:
        version, _ = workflow_save(team=team, definition={
            "name": "pay", "input_schema": {"type": "object"}, "steps": [{
                "name": "pay", "type": "tool", "tool": "http.request", "side_effect": True,
                "params": {"method": "POST", "url": f"{sink.url}/pay"}}]}, actor=SETUP)

        live = run_start(version=version, input={}, actor=SETUP)
        assert wait_for_run(live.id, states=ENDED).state == "completed"
        assert sink.arrived == 1  # the sink counts what reaches it

        sandboxed = run_start(version=version, input={}, actor=SETUP, capacity="evaluation",
                              sandbox={"purpose": "evaluation",
                                       "responses": {"pay": {"status": 201, "body": {"ok": 1}}}})
        assert wait_for_run(sandboxed.id, states=ENDED).state == "completed"

        assert sink.arrived == 1
        assert steps_of(sandboxed.id)["pay"].output == {"status": 201, "body": {"ok": 1}}
        assert steps_of(sandboxed.id)["pay"].queue == "tools.evaluation"
