"""Fixtures for the audit ledger: a finished support run, reading the ledger, tampering with it.

Runs are driven in-process through `orchestrator.tasks.execute_step`, the worker's own code
path (claim, executor with its external calls, commit), so the ledger sees exactly what a
worker would write. Tampering goes around the triggers the way a person with database access
would (dropping or disabling them), inside the test's transaction, so it is rolled back.
"""
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection, transaction

from approvals.models import ApprovalRequest
from audit.chain import seal_pending
from audit.models import AuditEntry
from audit.services import audit_record
from orchestrator.engine import clock
from orchestrator.engine.services.kinds.human_gate import approval_grant
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Run, StepRun, StepState
from orchestrator.tasks import execute_step
from tests.factories import example_definition

SUPPORT_INPUT = {"ticket_id": "T-7", "body": "Please refund my invoice",
                 "customer_email": "carol.customer@example.com"}
SENSITIVE = ["input.customer_email", "steps.draft.output.reply"]


def ledger(**filters) -> list[AuditEntry]:
    """Entries in chain order (this transaction's entries chained first, on PostgreSQL)."""
    seal_pending()
    return list(AuditEntry.objects.filter(**filters).order_by("sequence"))


def work(run: Run) -> Run:
    """Execute every queued step of `run` as a worker would, until none is queued."""
    while True:
        queued = list(StepRun.objects.filter(run=run, state=StepState.QUEUED).values_list("id", flat=True))
        if not queued:
            return Run.objects.get(pk=run.pk)
        for step_id in queued:
            execute_step(step_id)


def support_definition(**audit) -> dict:
    definition = example_definition("support")
    if audit:
        definition["audit"] = audit
    return definition


def finished_support_run(team, requester, approver, *, definition=None, note="Offer a voucher") -> Run:
    version, _ = workflow_save(team=team, definition=definition or support_definition(), actor=requester)
    run = work(run_start(version=version, input=SUPPORT_INPUT, actor=requester))
    approval = ApprovalRequest.objects.get(run=run)
    approval_grant(approval_id=approval.id, user=approver, proposal_hash=approval.proposal_hash,
                   note=note)
    return work(run)


@pytest.fixture
def support_run(team, requester, approver) -> Run:
    """A support run taken through every step, the approval and the e-mail, finished."""
    return finished_support_run(team, requester, approver)


@contextmanager
def triggers_bypassed():
    """What someone with database access can do: switch the ledger's guards off."""
    seal_pending()  # PostgreSQL refuses ALTER TABLE while the seal has pending work
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("ALTER TABLE audit_entry DISABLE TRIGGER audit_entry_guard")
        else:
            saved = dict(cursor.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'audit_entry'"
            ).fetchall())
            for name in saved:
                cursor.execute(f"DROP TRIGGER {name}")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("ALTER TABLE audit_entry ENABLE TRIGGER audit_entry_guard")
            else:
                for sql in saved.values():
                    cursor.execute(sql)


def tamper(sql: str, params=()) -> None:
    with triggers_bypassed(), connection.cursor() as cursor:
        cursor.execute(sql, params)


@pytest.fixture
def auditor():
    """A compliance reviewer: a staff account in `auditors`, with no model permission."""
    user = User.objects.create_user("auditor", is_staff=True)
    user.groups.add(Group.objects.get_or_create(name="auditors")[0])
    return user


@pytest.fixture
def member(requester):
    """A team member with a staff account, but not an auditor."""
    requester.is_staff = True
    requester.save()
    return requester


@pytest.fixture
def old_and_new(monkeypatch):
    """Five entries recorded 400 days ago, then three today."""
    today = clock.now()
    monkeypatch.setattr(clock, "_source", lambda: today - timedelta(days=400))
    with transaction.atomic():
        for i in range(5):
            audit_record(action="test.old", actor="service:test", subject_type="ledger", subject_id=i)
    monkeypatch.setattr(clock, "_source", lambda: today)
    with transaction.atomic():
        for i in range(3):
            audit_record(action="test.new", actor="service:test", subject_type="ledger", subject_id=i)
    return ledger(action="test.old"), ledger(action="test.new")
