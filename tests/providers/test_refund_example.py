"""The refund-proposal example offline: scripted proposals, computed risk, and a gate the
scheduler opens only when the risk rules require it (the model has no say)."""
import pytest

from orchestrator.engine.definitions import normalize_definition
from orchestrator.engine.scheduler import StepView, plan
from tests.factories import example_definition

ORDER = {"order_id": "ORD-1002", "total_usd": 1200.0, "customer_email": "bo@example.com"}


def step_input(message: str, order_id: str = "ORD-1002", order: dict | None = None) -> dict:
    return {"input": {"order_id": order_id, "message": message},
            "steps": {"order": {"state": "completed", "output": order or ORDER}}}


@pytest.mark.django_db
@pytest.mark.parametrize("message, action, tier, approval", [
    ("The mug arrived scratched.", "refund", "low", False),
    ("My parcel never arrived.", "refund", "high", True),
    ("Just wanted to say hi.", "decline", "low", False),
])
def test_scripted_proposals_get_their_risk_from_the_rules(run_step, message, action, tier, approval):
    given = step_input(message)

    output = run_step("propose", given["input"], given,
                      definition=example_definition("refund-proposal")).output

    assert output["proposal"]["action_type"] == action
    assert (output["risk"]["tier"], output["risk"]["requires_approval"]) == (tier, approval)
    assert len(output["proposal_hash"]) == 64


@pytest.mark.django_db
def test_a_full_refund_of_a_small_order_is_critical(run_step):
    given = step_input("It never arrived", "ORD-1001",
                       {"order_id": "ORD-1001", "total_usd": 40.0, "customer_email": "ann@example.com"})

    risk = run_step("propose", given["input"], given,
                    definition=example_definition("refund-proposal")).output["risk"]

    assert risk["tier"] == "critical"
    assert "the refund exceeds the order total" in risk["reasons"]


def proposed(action: str, requires_approval: bool) -> StepView:
    params = {"order_id": "ORD-1002", "amount_usd": 10.0} if action == "refund" else {"explanation": "no"}
    return StepView("completed", {
        "proposal": {"action_type": action, "params": params, "evidence": ["x"], "rationale": "y",
                     "confidence": 0.9},
        "proposal_hash": "0" * 64,
        "risk": {"tier": "high" if requires_approval else "low", "reasons": [],
                 "requires_approval": requires_approval}})


DEFINITION = normalize_definition(example_definition("refund-proposal"))
INPUT = {"order_id": "ORD-1002", "message": "m"}


def test_no_approval_required_skips_the_gate_and_the_tool_runs():
    first = plan(DEFINITION, INPUT, {"order": StepView("completed", ORDER),
                                     "propose": proposed("refund", False), "approve": StepView("blocked"),
                                     "refund": StepView("blocked"), "reply": StepView("blocked")})
    assert [name for name, _ in first.skip] == ["approve", "reply"]  # a refund is not a decline
    assert [name for name, _ in first.ready] == ["refund"]
    assert dict(first.skip)["approve"].startswith("condition is false")


def test_approval_required_opens_the_gate_and_the_tool_waits_for_it():
    views = {"order": StepView("completed", ORDER), "propose": proposed("refund", True),
             "approve": StepView("blocked"), "refund": StepView("blocked"), "reply": StepView("blocked")}
    first = plan(DEFINITION, INPUT, views)
    assert [name for name, _ in first.ready] == ["approve"]
    assert "refund" not in dict(first.ready) and "refund" not in dict(first.skip)

    waiting = plan(DEFINITION, INPUT, {**views, "approve": StepView("waiting")})
    assert waiting.ready == [] and waiting.outcome == "wait"

    approved = plan(DEFINITION, INPUT, {**views, "approve": StepView("completed", {"approved": True})})
    assert [name for name, _ in approved.ready] == ["refund"]


def test_a_rejected_gate_fails_the_run_and_nothing_is_refunded():
    rejected = plan(DEFINITION, INPUT, {"order": StepView("completed", ORDER),
                                        "propose": proposed("refund", True), "approve": StepView("failed"),
                                        "refund": StepView("blocked"), "reply": StepView("blocked")})
    assert rejected.ready == [] and rejected.outcome == "fail"


def test_a_decline_sends_the_reply_to_the_address_on_the_order_not_one_from_the_model():
    decided = plan(DEFINITION, INPUT, {"order": StepView("completed", ORDER),
                                       "propose": proposed("decline", False), "approve": StepView("blocked"),
                                       "refund": StepView("blocked"), "reply": StepView("blocked")})
    assert [name for name, _ in decided.ready] == ["reply"]
    reply = next(s for s in DEFINITION["steps"] if s["name"] == "reply")
    assert reply["params"]["to"] == "{{ steps.order.output.customer_email }}"
