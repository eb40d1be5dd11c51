"""One recording service: every transition, gate decision, external call, retry and redrive
writes exactly one ledger entry, in the transaction of the change it records."""
from collections import Counter

import pytest
from django.db import transaction

from approvals.models import ApprovalRequest
from audit.chain import verify_ledger
from audit.models import AuditEntry
from audit.services import audit_record
from orchestrator.engine.services.kinds.human_gate import approval_reject
from orchestrator.engine.services.kinds.worker import step_retry_due
from orchestrator.engine.services.operators import dead_letter_redrive
from orchestrator.engine.services.runs import run_cancel, run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import DeadLetter, Event, Role, Run, StepRun
from tests.factories import SETUP, member

from .conftest import SUPPORT_INPUT, ledger, support_definition, work

pytestmark = pytest.mark.django_db


def assert_one_entry_per_event(run: Run) -> list[AuditEntry]:
    entries = ledger(run_id=run.id)
    recorded = Counter(e.event_id for e in entries if e.event_id is not None)
    events = dict(Event.objects.filter(run=run).values_list("id", "kind"))
    assert set(recorded) == set(events), "every outbox event has a ledger entry, and no other"
    assert set(recorded.values()) == {1}, "and exactly one"
    for entry in entries:
        if entry.event_id is not None:
            assert entry.action == events[entry.event_id]
    return entries


def test_every_transition_of_a_finished_support_run_is_recorded_exactly_once(support_run):
    entries = assert_one_entry_per_event(support_run)

    actions = [e.action for e in entries]
    assert actions[0] == "run.created" and actions[-1] == "run.completed"
    assert support_run.state == "completed"
    for step in ("classify", "research", "fetch_history", "draft", "send"):
        assert [a for e, a in zip(entries, actions, strict=True) if e.step_name == step
                and a.startswith("step.")] == [
            "step.ready", "step.queued", "step.running", "step.completed"], step


def test_every_external_call_is_authorized_by_exactly_one_entry_before_it(support_run):
    entries = ledger(run_id=support_run.id)
    calls = [e for e in entries if e.action == "external_call.authorized"]

    assert [(e.step_name, e.data["kind"], e.data["target"]) for e in calls] == [
        ("classify", "model", "scripted:fast"), ("research", "model", "scripted:deep"),
        ("fetch_history", "tool", "support.fetch_history"), ("draft", "model", "scripted:deep"),
        ("send", "tool", "email.send")]
    for call in calls:
        assert call.idempotency_key == f"{support_run.id}:{call.step_name}:default"
        assert call.actor.startswith("worker:") and call.outcome == "authorized"
        position = entries.index(call)
        before = [e.action for e in entries[:position] if e.step_name == call.step_name]
        after = [e.action for e in entries[position:] if e.step_name == call.step_name]
        assert before[-1] in ("step.running", "effect.started")  # claimed, then authorized
        assert "step.completed" in after and "step.completed" not in before


def test_a_pure_tool_makes_no_external_call_and_a_declared_side_effect_is_still_authorized(team):
    version, _ = workflow_save(team=team, definition={
        "name": "pure", "input_schema": {"type": "object"}, "steps": [
            {"name": "echo", "type": "tool", "tool": "core.echo", "params": {"n": 1}},
            {"name": "declared", "type": "tool", "tool": "core.echo", "side_effect": True,
             "params": {"n": 2}, "after": ["echo"]}]}, actor=SETUP)
    run = work(run_start(version=version, input={}, actor=SETUP))

    assert run.state == "completed"
    entries = assert_one_entry_per_event(run)
    calls = [e for e in entries if e.action == "external_call.authorized"]
    assert [(e.step_name, e.data["target"], e.data["request"]) for e in calls] == [
        ("declared", "core.echo", {"n": 2})]
    echoed = [e.action for e in entries if e.step_name == "echo"]
    assert echoed == ["step.ready", "step.queued", "step.running", "step.completed"]
    assert verify_ledger().ok


def test_entries_carry_versions_models_prompts_and_keys(support_run):
    entries = ledger(run_id=support_run.id)
    version = support_run.version
    created = entries[0]

    assert {(e.workflow, e.workflow_version, e.definition_digest, e.team) for e in entries} == {
        ("support-reply", version.number, version.digest, "support")}
    assert created.actor == "user:requester" and created.actor_kind == "user"
    assert created.data["trigger"] == "api"
    assert created.data["policy"]["gates"] == [
        {"step": "approve", "approvers": "support_leads", "timeout_s": 14400}]
    draft = [e for e in entries if e.step_name == "draft" and e.action == "step.completed"][0]
    assert draft.model == "deep" and draft.prompt_version.startswith("sha256:")
    assert draft.idempotency_key == f"{support_run.id}:draft:default"
    sent = [e for e in entries if e.step_name == "send" and e.action == "step.completed"][0]
    assert sent.correlation_id == sent.data["output"]["message_id"]


def test_the_gate_decision_is_recorded_with_its_approver_and_proposal_hash(support_run):
    approval = ApprovalRequest.objects.get(run=support_run)
    decided = ledger(run_id=support_run.id, action="approval.approved")

    assert len(decided) == 1
    [entry] = decided
    assert entry.actor == "user:approver" and entry.subject_type == "approval"
    assert entry.subject_id == str(approval.id)
    assert entry.proposal_hash == approval.proposal_hash
    assert entry.data["note"] == "Offer a voucher"
    requested = ledger(run_id=support_run.id, action="approval.requested")
    assert [e.proposal_hash for e in requested] == [approval.proposal_hash]


def test_a_rejection_is_one_entry_and_the_run_fails(team, requester, approver):
    version, _ = workflow_save(team=team, definition=support_definition(), actor=requester)
    run = work(run_start(version=version, input=SUPPORT_INPUT, actor=requester))
    gate = ApprovalRequest.objects.get(run=run)
    approval_reject(approval_id=gate.id, user=approver, proposal_hash=gate.proposal_hash, note="no")

    rejected = ledger(run_id=run.id, action="approval.rejected")
    assert len(rejected) == 1 and rejected[0].actor == "user:approver"
    assert ledger(run_id=run.id, action="run.failed")
    assert_one_entry_per_event(run)


def flaky_definition(url: str, attempts: int) -> dict:
    return {"name": "flaky", "input_schema": {"type": "object"}, "steps": [{
        "name": "post", "type": "tool", "tool": "http.request",
        "retry": {"max_attempts": attempts, "base_s": 0, "max_s": 0, "jitter": False},
        "params": {"method": "POST", "url": url}}]}


def test_a_retry_is_one_entry_and_each_attempt_one_authorized_call(team):
    from tests.support.http_sink import HttpSink

    with HttpSink() as sink:
        sink.fail_next(1, 503)
        version, _ = workflow_save(team=team, definition=flaky_definition(f"{sink.url}/x", 2), actor=SETUP)
        run = work(run_start(version=version, input={}, actor=SETUP))
        step = StepRun.objects.get(run=run, name="post")
        assert step.state == "retrying"
        assert step_retry_due(step_id=step.id)
        run = work(run)

    assert run.state == "completed"
    entries = assert_one_entry_per_event(run)
    assert [e.action for e in entries if e.action in ("step.retrying", "external_call.authorized")] == [
        "external_call.authorized", "step.retrying", "external_call.authorized"]
    assert [e.data["attempt"] for e in entries if e.action == "external_call.authorized"] == [1, 2]
    retrying = [e for e in entries if e.action == "step.retrying"][0]
    assert retrying.data["class"] == "transient"


def test_a_redrive_is_one_entry_by_the_operator_who_asked(team):
    from tests.support.http_sink import HttpSink

    operator = member(team, "operator", role=Role.OPERATOR)
    with HttpSink() as sink:
        sink.fail_next(1, 400)
        version, _ = workflow_save(team=team, definition=flaky_definition(f"{sink.url}/x", 1), actor=SETUP)
        run = work(run_start(version=version, input={}, actor=SETUP))
        assert run.state == "failed"
        letter = DeadLetter.objects.get(run=run)
        dead_letter_redrive(dead_letter_id=letter.id, actor=operator)
        run = work(run)

    assert run.state == "completed"
    entries = assert_one_entry_per_event(run)
    redriven = [e for e in entries if e.action == "dead_letter.redriven"]
    assert len(redriven) == 1 and redriven[0].actor == "user:operator"
    assert len([e for e in entries if e.action == "external_call.authorized"]) == 2


def test_a_cancellation_is_recorded_with_who_cancelled(team, requester, operator):
    version, _ = workflow_save(team=team, definition=support_definition(), actor=requester)
    run = run_start(version=version, input=SUPPORT_INPUT, actor=requester)
    run_cancel(run_id=run.id, actor=operator)

    entries = assert_one_entry_per_event(Run.objects.get(pk=run.pk))
    assert [e.action for e in entries if e.actor == "user:operator"][:1] == ["run.cancelling"]
    assert entries[-1].action == "run.cancelled"


def test_the_entry_is_rolled_back_with_the_change_it_records(team, requester):
    version, _ = workflow_save(team=team, definition=support_definition(), actor=requester)
    before = AuditEntry.objects.count()

    with pytest.raises(RuntimeError), transaction.atomic():
        run_start(version=version, input=SUPPORT_INPUT, actor=requester)
        raise RuntimeError("the change fails after it was recorded")

    assert AuditEntry.objects.count() == before
    assert not Run.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_audit_record_refuses_to_run_outside_a_transaction():
    with pytest.raises(RuntimeError, match="inside the transaction"):
        audit_record(action="budget.raised", actor="user:alice", subject_type="budget", subject_id=1)


def test_later_features_record_through_the_same_service():
    with transaction.atomic():
        entry = audit_record(action="budget.raised", actor="user:alice", subject_type="budget",
                             subject_id="support", outcome="raised",
                             payload={"from": "2.00", "to": "5.00", "api_key": "sk-live-123"})

    assert entry.actor_kind == "user" and entry.data["from"] == "2.00"
    assert entry.data["api_key"]["summary"] == "***"
    assert verify_ledger().ok


def test_a_budget_gate_that_pauses_a_run_is_one_entry_saying_why(team):
    version, _ = workflow_save(team=team, definition={
        "name": "pricey", "input_schema": {"type": "object"}, "budget": {"max_cost_usd": 0.01},
        "steps": [{"name": "think", "type": "agent", "model": "deep", "prompt": "think",
                   "output_schema": {"type": "object"}, "script": [{"output": {}}]}]}, actor=SETUP)
    run = run_start(version=version, input={}, actor=SETUP)

    assert Run.objects.get(pk=run.pk).state == "paused"
    entries = assert_one_entry_per_event(run)
    [paused] = [e for e in entries if e.action == "run.paused"]
    assert paused.data["class"] == "budget" and paused.data["step"] == "think"
    assert "would exceed the limit of $0.01" in paused.data["message"] and paused.data["level"] == "run"
    assert not [e for e in entries if e.action == "external_call.authorized"]
