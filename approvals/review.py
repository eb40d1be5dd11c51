"""What the decision page shows a reviewer, built from persisted state only.

`review_of(approval, user)` gathers, for one request: the action and what it will do (each
guarded step as it will run, a message as it will be sent), the risk tier with each reason, the
model's evidence, rationale and confidence, the run's input, the history of decisions, and what
this person may do now (and if not, why). Nothing here changes state or invents text: a value
that is absent is left out, never replaced by a stand-in.
"""
import json
from dataclasses import dataclass, field
from datetime import datetime

from orchestrator.engine.clock import now
from orchestrator.engine.errors import Forbidden
from orchestrator.engine.selectors import definition_of
from orchestrator.engine.states import StepState
from orchestrator.models import StepRun

from .actions import EffectPreview, action_summary, effect_previews
from .authority import approvers_of, may_decide, require_separation
from .models import ApprovalRequest, ApprovalState

CONFIRM_TIERS = ("high", "critical")
PAST = {"approve": "approved", "reject": "rejected", "edit": "edited", "revoke": "revoked"}
NOT_STARTED = (StepState.BLOCKED, StepState.READY, StepState.QUEUED)


@dataclass(frozen=True)
class Row:
    name: str
    value: str
    multiline: bool = False


@dataclass(frozen=True)
class HistoryLine:
    at: datetime
    who: str
    verdict: str
    note: str
    proposal_hash: str
    changes: list[Row] = field(default_factory=list)


@dataclass
class Review:
    approval: ApprovalRequest
    workflow: str
    summary: str
    action_title: str
    params: list[Row]
    effects: list[EffectPreview]
    explanation: dict
    run_input: list[Row]
    upstream: list[tuple[str, str]]
    history: list[HistoryLine]
    requester: str
    given: int
    overdue: bool
    may_decide: bool
    approve_barred: str  # why this person may not approve ("" when they may)
    needs_confirmation: bool
    editable: list[Row]
    may_revoke: bool
    note_used_by: list[str]  # guarded steps whose parameters include the reviewer's note
    # The message the action sends, when the action is a tool step's message-like call: shown
    # once, as it will be sent, in place of the parameters table and of that step's preview.
    action_message: dict | None = None
    cost_usd: object = None  # what the run has spent so far
    budget_usd: object = None  # the run's max_cost_usd, when it has one


def shown(value: object) -> tuple[str, bool]:
    """A value as a person reads it: strings as they are, anything else as indented JSON."""
    if isinstance(value, str):
        return value, "\n" in value or len(value) > 80
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    return text, "\n" in text


def rows_of(mapping: object) -> list[Row]:
    if not isinstance(mapping, dict):
        return []
    return [Row(str(key), *shown(value)) for key, value in mapping.items()]


def _action_title(approval: ApprovalRequest) -> str:
    action = approval.action or {}
    if approval.action_kind == "proposal":
        return f"{action.get('action_type')}, proposed by step '{approval.action_source}'"
    if approval.action_kind == "step":
        return f"{action.get('tool')}, called by step '{approval.action_source}'"
    return "let the run continue with the data below"


def _history(approval: ApprovalRequest) -> list[HistoryLine]:
    lines = []
    for decision in approval.decisions.select_related("user"):
        changes = [Row(name, f"{shown(change.get('from'))[0]} → {shown(change.get('to'))[0]}")
                   for name, change in (decision.changes.get("params") or {}).items()]
        lines.append(HistoryLine(decision.created_at, decision.user.get_username()
                                 if decision.user else "a deleted user", PAST[decision.verdict],
                                 decision.note, decision.proposal_hash, changes))
    return lines


def _approve_barred(user, approval: ApprovalRequest) -> str:
    try:
        require_separation(user, approval)
    except Forbidden as exc:
        return str(exc)
    if approvers_of(approval).filter(user=user).exists():
        return "you have approved this already; another approver must add theirs"
    return ""


def review_of(approval: ApprovalRequest, user) -> Review:
    run = approval.run
    deciding = may_decide(user, approval)
    pending = approval.state == ApprovalState.PENDING
    params = (approval.action.get("params") or {}) if approval.action_kind != "context" else {}
    # Only the editable parameters this action has (a proposal's other actions have others).
    editable = [Row(name, *shown(params[name])) for name in approval.editable if name in params]
    upstream = [(name, shown((item or {}).get("output"))[0])
                for name, item in (approval.context or {}).items()]
    effects = effect_previews(approval)
    action_message = None
    if approval.action_kind == "step":
        own = next((e for e in effects if e.step == approval.action_source and e.message), None)
        if own is not None:
            action_message = own.message
            effects = [e for e in effects if e is not own]
    definition, _ = definition_of(run)
    started = StepRun.objects.filter(run=run, name__in=approval.guarded_steps).exclude(
        state__in=[*NOT_STARTED, StepState.SKIPPED, StepState.CANCELLED]).exists()
    return Review(
        approval=approval,
        workflow=run.version.workflow.name,
        summary=action_summary(approval),
        action_title=_action_title(approval),
        params=rows_of((approval.action or {}).get("params")) if approval.action_kind != "context" else [],
        effects=effects,
        explanation=approval.explanation or {},
        run_input=rows_of(run.input),
        upstream=upstream,
        history=_history(approval),
        requester=run.created_by.get_username() if run.created_by else "",
        given=approvers_of(approval).values("user").distinct().count(),
        overdue=pending and approval.deadline_at < now(),
        may_decide=deciding and pending,
        approve_barred=_approve_barred(user, approval) if deciding and pending else "",
        needs_confirmation=approval.risk_tier in CONFIRM_TIERS,
        editable=editable if deciding and pending else [],
        may_revoke=deciding and approval.state == ApprovalState.APPROVED and not started,
        note_used_by=_note_used_by(approval),
        action_message=action_message,
        cost_usd=run.cost_usd,
        budget_usd=(definition.get("budget") or {}).get("max_cost_usd"),
    )


def _note_used_by(approval: ApprovalRequest) -> list[str]:
    """Guarded steps whose parameters render the gate's note (so it reaches someone)."""
    _, graph = definition_of(approval.run)
    needle = f"steps.{approval.step.name}.output.note"
    return [name for name in approval.guarded_steps
            if needle in json.dumps(graph.steps[name].get("params") or {})]

