"""Risk tiers are decided by deterministic rules, table-driven here: every factor, every edge."""
import pytest

from orchestrator.engine.risk import assess, in_scope

REFUND_RISK = {
    "tier": "low",
    "amount": {"param": "amount_usd", "medium": 50, "high": 500, "critical": 5000},
    "rules": [
        {"when": "proposal.params.amount_usd > steps.order.output.total_usd", "tier": "critical",
         "reason": "the refund exceeds the order total"},
    ],
}
EMAIL_RISK = {"tier": "medium", "recipient": {"param": "to", "allowed": ["example.com", "ops@partner.io"]}}


def declaration(**policy) -> dict:
    return {"approval_at": "medium", "min_confidence": 0.5, **policy, "actions": [
        {"type": "refund", "params_schema": {"type": "object"}, "risk": REFUND_RISK},
        {"type": "send_email", "params_schema": {"type": "object"}, "risk": EMAIL_RISK},
        {"type": "tag", "params_schema": {"type": "object"}},
        {"type": "close_account", "params_schema": {"type": "object"}, "risk": {"tier": "critical"}},
    ]}


def proposal(action_type="refund", params=None, evidence=("the item arrived broken",),
             confidence=0.9) -> dict:
    return {"action_type": action_type, "params": params if params is not None else {"amount_usd": 10.0},
            "evidence": list(evidence), "rationale": "because", "confidence": confidence}


ORDER = {"input": {}, "steps": {"order": {"state": "completed", "output": {"total_usd": 1000.0}}}}

CASES = [
    # (id, proposal, repairs, policy, expected tier, requires approval, a reason fragment)
    ("low-refund", proposal(), 0, {}, "low", False, "'refund' is low risk"),
    ("just-under-medium", proposal(params={"amount_usd": 49.99}), 0, {}, "low", False, "low risk"),
    ("medium-threshold-inclusive", proposal(params={"amount_usd": 50.0}), 0, {}, "medium", True,
     "amount_usd 50.0 >= 50"),
    ("high-threshold", proposal(params={"amount_usd": 500.0}), 0, {}, "high", True, ">= 500 (high"),
    ("over-the-order-total", proposal(params={"amount_usd": 1000.01}), 0, {}, "critical", True,
     "exceeds the order total"),
    ("critical-threshold", proposal(params={"amount_usd": 5000.0}), 0, {}, "critical", True, ">= 5000"),
    ("amount-missing", proposal(params={}), 0, {}, "critical", True, "cannot be assessed"),
    ("amount-not-a-number", proposal(params={"amount_usd": "10"}), 0, {}, "critical", True,
     "not a number"),
    ("action-type-tier", proposal("close_account", {}), 0, {}, "critical", True, "critical risk"),
    ("undeclared-risk-is-low", proposal("tag", {"label": "vip"}), 0, {}, "low", False, "low risk"),
    ("recipient-in-domain", proposal("send_email", {"to": "ann@example.com"}), 0,
     {"approval_at": "high"}, "medium", False, "medium risk"),
    ("recipient-exact-address", proposal("send_email", {"to": "OPS@partner.io"}), 0,
     {"approval_at": "high"}, "medium", False, "medium risk"),
    ("recipient-outside", proposal("send_email", {"to": "ann@evil.example"}), 0, {}, "high", True,
     "outside the allowed recipients"),
    ("recipient-subdomain-is-outside", proposal("send_email", {"to": "a@mail.example.com"}), 0, {},
     "high", True, "outside"),
    ("recipient-list-one-outside", proposal("send_email", {"to": ["a@example.com", "b@evil.example"]}),
     0, {}, "high", True, "'b@evil.example'"),
    ("recipient-missing", proposal("send_email", {}), 0, {}, "high", True, "missing"),
    ("no-evidence", proposal(evidence=()), 0, {}, "medium", True, "cites no evidence"),
    ("repaired", proposal(), 1, {}, "medium", True, "needed 1 repair"),
    ("low-confidence", proposal(confidence=0.49), 0, {}, "high", True, "confidence 0.49 is below 0.5"),
    ("confidence-at-minimum", proposal(confidence=0.5), 0, {}, "low", False, "low risk"),
    ("stricter-minimum", proposal(confidence=0.7), 0, {"min_confidence": 0.8}, "high", True, "below 0.8"),
    ("approval-at-low", proposal(), 0, {"approval_at": "low"}, "low", True, "low risk"),
    ("approval-at-critical", proposal(params={"amount_usd": 600.0}), 0, {"approval_at": "critical"},
     "high", False, "high threshold"),
    ("critical-always-approved", proposal("close_account", {}), 0, {"approval_at": "critical"},
     "critical", True, "critical risk"),
    ("highest-factor-wins", proposal(params={"amount_usd": 60.0}, evidence=(), confidence=0.1), 1, {},
     "high", True, "confidence"),
]


@pytest.mark.parametrize("value, repairs, policy, tier, approval, reason",
                         [pytest.param(*case[1:], id=case[0]) for case in CASES])
def test_risk_tier_rules(value, repairs, policy, tier, approval, reason):
    risk = assess(declaration=declaration(**policy), proposal=value, step_input=ORDER, repairs=repairs)

    assert (risk.tier, risk.requires_approval) == (tier, approval)
    assert any(reason in r for r in risk.reasons), risk.reasons


def test_the_amount_missing_is_high_even_before_rules():
    risk = assess(declaration={"actions": [
        {"type": "refund", "params_schema": {"type": "object"},
         "risk": {"amount": {"param": "amount_usd", "high": 1}}}]},
        proposal=proposal(params={}), step_input=ORDER)
    assert risk.tier == "high"


@pytest.mark.parametrize("when, reason", [
    ("proposal.params.nope > 1", "could not be evaluated"),
    ("proposal.params.amount_usd", "not a boolean"),
])
def test_a_rule_that_cannot_be_evaluated_fails_safe_as_critical(when, reason):
    decl = {"actions": [{"type": "refund", "params_schema": {"type": "object"},
                         "risk": {"rules": [{"when": when, "tier": "low"}]}}]}
    risk = assess(declaration=decl, proposal=proposal(), step_input=ORDER)
    assert risk.tier == "critical" and risk.requires_approval
    assert any(reason in r for r in risk.reasons)


def test_the_model_cannot_lower_its_tier_with_confidence():
    big = proposal(params={"amount_usd": 900.0}, confidence=1.0)
    assert assess(declaration=declaration(), proposal=big, step_input=ORDER).tier == "high"


def test_assessment_is_deterministic():
    value = proposal(params={"amount_usd": 75.0})
    first = assess(declaration=declaration(), proposal=value, step_input=ORDER)
    assert all(assess(declaration=declaration(), proposal=value, step_input=ORDER) == first
               for _ in range(5))
    assert first.as_dict() == {"tier": "medium", "reasons": list(first.reasons), "requires_approval": True}


@pytest.mark.parametrize("value, allowed", [
    ("ann@example.com", True),
    ("ANN@Example.COM ", True),
    ("https://example.com/hook", True),
    ("https://example.com.evil.io/hook", False),
    ("https://evil.io/?next=example.com", False),
    ("ann@example.com@evil.io", False),
    ("example.com", True),
    ("", False),
    (None, False),
    (42, False),
])
def test_recipient_scope(value, allowed):
    assert in_scope(value, ["example.com"]) is allowed


# --- the exact findings (from mutation testing: each of these was a surviving mutant) ---------


def assessed(action_type="refund", params=None, **kwargs):
    return assess(declaration=declaration(), proposal=proposal(action_type, params, **kwargs),
                  step_input=ORDER)


def test_the_highest_threshold_reached_is_the_one_reason_given_for_the_amount():
    assert assessed(params={"amount_usd": 600.0}).reasons == (
        "action 'refund' is low risk", "amount_usd 600.0 >= 500 (high threshold)")


def test_a_proposal_without_evidence_says_so_in_those_words():
    assert assessed(evidence=()).reasons[-1] == "the proposal cites no evidence"


def test_assess_counts_no_repair_unless_told():
    risk = assess(declaration=declaration(), proposal=proposal(), step_input=ORDER)
    assert (risk.tier, risk.reasons) == ("low", ("action 'refund' is low risk",))


def recipient_declaration(**rule) -> dict:
    return {"actions": [{"type": "send_email", "params_schema": {"type": "object"},
                         "risk": {"recipient": {"param": "to", "allowed": ["example.com"], **rule}}}]}


def test_a_recipient_outside_takes_the_declared_outside_tier():
    risk = assess(declaration=recipient_declaration(outside="critical"),
                  proposal=proposal("send_email", {"to": "x@evil.io"}), step_input=ORDER)
    assert risk.tier == "critical"


def test_a_list_of_recipients_all_in_scope_adds_nothing():
    risk = assess(declaration=recipient_declaration(),
                  proposal=proposal("send_email", {"to": ["a@example.com", "b@example.com"]}),
                  step_input=ORDER)
    assert (risk.tier, risk.reasons) == ("low", ("action 'send_email' is low risk",))


def test_the_recipients_outside_are_named_five_at_most():
    strangers = [f"u{i}@evil.io" for i in range(7)]
    risk = assess(declaration=recipient_declaration(),
                  proposal=proposal("send_email", {"to": strangers}), step_input=ORDER)
    shown = ", ".join(repr(s) for s in strangers[:5])
    assert risk.reasons[-1] == f"to {shown} is outside the allowed recipients"


def test_every_rule_is_assessed_after_one_that_cannot_be():
    decl = {"actions": [{"type": "refund", "params_schema": {"type": "object"}, "risk": {"rules": [
        {"when": "proposal.params.nope > 1", "tier": "low"},
        {"when": "proposal.params.amount_usd > 1.0", "tier": "medium"}]}}]}
    risk = assess(declaration=decl, proposal=proposal(), step_input=ORDER)
    assert risk.reasons[-1] == "rule 'proposal.params.amount_usd > 1.0' holds"


@pytest.mark.parametrize("value", ["https:///no-host", "https://", "ann@", "@"])
def test_a_blank_allowed_entry_admits_no_recipient_without_a_host_or_domain(value):
    assert not in_scope(value, [" ", "example.com"])
