"""The approval request's state machine, table-driven: every allowed and every forbidden
transition, from every state (django-fsm raises for a forbidden one; nothing changes)."""
import pytest
from django_fsm import TransitionNotAllowed

from approvals.models import ApprovalRequest, ApprovalState
from orchestrator.engine.clock import now

STATES = list(ApprovalState.values)
ARGS = {
    "approve": {"user": None, "note": "ok"},
    "reject": {"user": None, "note": "no"},
    "expire": {},
    "cancel": {},
    "escalate": {"approvers": "managers", "deadline_at": None, "remind_at": None},
    "amend": {"user": None, "action": {"x": 1}, "proposal_hash": "b" * 64, "edits": {"x": 1},
              "risk_tier": "high", "risk_reasons": [], "amount": None, "approvals_required": 2},
    "revoke": {},
}
# (transition, source) -> target; every pair not listed is forbidden.
ALLOWED = {
    ("approve", "pending"): "approved",
    ("reject", "pending"): "rejected",
    ("expire", "pending"): "expired",
    ("cancel", "pending"): "cancelled",
    ("escalate", "pending"): "pending",
    ("amend", "pending"): "pending",
    ("revoke", "approved"): "revoked",
}
CASES = [(name, source) for name in ARGS for source in STATES]


def request_in(state: str) -> ApprovalRequest:
    return ApprovalRequest(state=state, approvers="leads", proposal_hash="a" * 64,
                           deadline_at=now())


def test_the_declared_transitions_are_exactly_the_table():
    declared = {(t.name, t.source): t.target for t in request_in("pending").get_all_state_transitions()}
    assert declared == ALLOWED


@pytest.mark.parametrize("name, source", CASES)
def test_each_transition_from_each_state(name, source):
    approval = request_in(source)
    target = ALLOWED.get((name, source))
    if target is None:
        with pytest.raises(TransitionNotAllowed):
            getattr(approval, name)(**ARGS[name])
        assert approval.state == source
    else:
        getattr(approval, name)(**ARGS[name])
        assert approval.state == target


def test_terminal_states_allow_nothing_but_revoking_an_approval():
    for state in ("rejected", "expired", "cancelled", "revoked"):
        assert [t.name for t in request_in(state).get_available_state_transitions()] == []
    assert [t.name for t in request_in("approved").get_available_state_transitions()] == ["revoke"]


def test_the_state_cannot_be_written_directly():
    approval = request_in("pending")
    with pytest.raises(AttributeError):
        approval.state = "approved"


def test_escalating_moves_the_request_to_the_next_group_with_a_fresh_reminder():
    approval = request_in("pending")
    approval.reminded_at = now()
    approval.escalate(approvers="managers", deadline_at=now(), remind_at=None)
    assert (approval.approvers, approval.escalation_level, approval.reminded_at) == ("managers", 1, None)
