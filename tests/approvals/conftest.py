"""Fixtures for approvals: reviewers, a controlled clock, gates of the example workflows.

Runs are driven in-process through `orchestrator.tasks.execute_step`, the worker's own code
path (claim with the approval re-check, executor, commit), so what a test sees — the e-mail in
the outbox, a refused step — is what a worker would do. On-commit callbacks (dispatch,
notification delivery) do not fire inside a test's transaction.
"""
import json
import time
from datetime import timedelta

import pytest
from django.test import Client

from approvals.models import ApprovalRequest
from examples.tools import outbox_path
from orchestrator.engine import clock
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role, Run, StepRun, StepState
from orchestrator.tasks import execute_step
from tests.factories import SETUP, example_definition, member

SUPPORT_INPUT = {"ticket_id": "T-9", "body": "My invoice is wrong, I want a refund.",
                 "customer_email": "dana@example.com"}


@pytest.fixture
def lead(team):
    """A support lead: may decide the support example's gate."""
    return member(team, "lead", role=Role.MEMBER, groups=("support_leads",))


@pytest.fixture
def second_lead(team):
    return member(team, "lead2", role=Role.MEMBER, groups=("support_leads",))


@pytest.fixture
def manager(team):
    """A support manager: decides once the gate escalates."""
    return member(team, "manager", role=Role.MEMBER, groups=("support_managers",))


class Clock:
    """The injectable clock (`orchestrator.engine.clock`), moved by hand."""

    def __init__(self, start):
        self.at = start

    def __call__(self):
        return self.at

    def advance(self, **delta) -> None:
        self.at += timedelta(**delta)


@pytest.fixture
def frozen_clock(monkeypatch):
    controlled = Clock(clock.now())
    monkeypatch.setattr(clock, "_source", controlled)
    return controlled


def work(run: Run) -> Run:
    """Execute every queued step of `run` as a worker would, until none is queued."""
    while True:
        queued = list(StepRun.objects.filter(run=run, state=StepState.QUEUED)
                      .values_list("id", flat=True))
        if not queued:
            return Run.objects.get(pk=run.pk)
        for step_id in queued:
            execute_step(step_id)


def gate_of(run: Run, *, wait_s: float = 30) -> ApprovalRequest:
    """`run`'s approval request. Beside a live server's real workers (the browser tests), a
    worker may hold one of the run's steps when `work` finds nothing queued: the request is
    then waited for, working whatever is queued again meanwhile."""
    deadline = time.monotonic() + wait_s
    while True:
        request = ApprovalRequest.objects.select_related("run", "step").filter(run=run).first()
        if request is not None or time.monotonic() > deadline:
            return request or ApprovalRequest.objects.get(run=run)
        time.sleep(0.2)
        work(run)


def support_gate(team, starter, *, changes: dict | None = None, body: str | None = None
                 ) -> ApprovalRequest:
    """A support run started by `starter`, worked up to its waiting gate. `changes` are set on
    the gate step's definition."""
    definition = example_definition("support")
    gate = next(s for s in definition["steps"] if s["name"] == "approve")
    gate.update(changes or {})
    version, _ = workflow_save(team=team, definition=definition, actor=SETUP)
    data = {**SUPPORT_INPUT, "body": body} if body else SUPPORT_INPUT
    return gate_of(work(run_start(version=version, input=data, actor=starter)))


def refund_gate(team, starter, *, message: str, order_id: str = "ORD-1002") -> ApprovalRequest:
    version, _ = workflow_save(team=team, definition=example_definition("refund-proposal"),
                               actor=SETUP)
    run = work(run_start(version=version, input={"order_id": order_id, "message": message},
                         actor=starter))
    return gate_of(run)


def sent_emails(run) -> list[dict]:
    """What `email.send` wrote to the outbox for `run`."""
    path = outbox_path()
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [row for row in rows if row["idempotency_key"].startswith(f"{run.pk}:")]


INBOX = "/admin/approvals/approvalrequest/"


def signed_in(user) -> Client:
    """A browser session of `user` in the admin."""
    client = Client()
    client.force_login(user)
    return client
