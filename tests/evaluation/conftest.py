"""Fixtures of the dataset tests: the refund example saved in the support team, the people of
that team in each role and of another team, and a finished run of the example, driven through
the services a worker calls (no worker runs here)."""
import json
from pathlib import Path

import pytest

from evaluation.services import dataset_create
from orchestrator.engine.services.kinds.worker import Usage, step_claim, step_succeed
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role, Run, StepState, Workflow
from tests.factories import SETUP, TeamFactory, UserFactory, example_definition, member

SAMPLES = Path(__file__).resolve().parents[2] / "examples" / "datasets"
ORDER = {"order_id": "ORD-1002", "total_usd": 80.0, "customer_email": "bo@example.com"}
DECLINE = {"proposal": {"action_type": "decline", "params": {"explanation": "Nothing to refund."},
                        "evidence": ["hi"], "rationale": "No defect.", "confidence": 0.9},
           "proposal_hash": "0" * 64, "risk": {"tier": "low", "reasons": [], "requires_approval": False}}
OUTPUTS = {"order": ORDER, "propose": DECLINE, "reply": {"sent": True}}


def sample_cases(name: str = "refund-proposal") -> list[dict]:
    return [json.loads(line) for line in (SAMPLES / f"{name}.jsonl").read_text().splitlines()]


def good_case(key: str = "c1", tier: str = "high", **changes) -> dict:
    return {"key": key, "input": {"order_id": "ORD-1001", "message": "It never arrived"},
            "expected": {"run": {"must_be_approved": True},
                         "steps": {"propose": {"action": {"name": "refund", "params": {"order_id": "ORD-1001",
                                                                                      "amount_usd": 40}}}}},
            "risk_tier": tier, "tags": ["delivery"], **changes}


@pytest.fixture
def refund(team) -> Workflow:
    version, _ = workflow_save(team=team, definition=example_definition("refund-proposal"), actor=SETUP)
    return version.workflow


@pytest.fixture
def editor(team):
    return member(team, "editor", role=Role.EDITOR, staff=True)


@pytest.fixture
def reader(team):
    return member(team, "reader", role=Role.MEMBER, staff=True)


@pytest.fixture
def owner(team):
    return member(team, "owner", role=Role.OWNER, staff=True)


@pytest.fixture
def elsewhere(db):
    """An editor of another team, which has a refund workflow of its own."""
    other = TeamFactory(slug="elsewhere", name="Elsewhere")
    workflow_save(team=other, definition=example_definition("refund-proposal"), actor=SETUP)
    return member(other, "elsewhere-editor", role=Role.EDITOR, staff=True)


@pytest.fixture
def superuser(db):
    return UserFactory(username="root", is_staff=True, is_superuser=True)


@pytest.fixture
def dataset(refund, editor):
    return dataset_create(workflow=refund, name="golden", actor=editor, description="Refund cases")


def finish(run: Run, outputs: dict = OUTPUTS) -> Run:
    """Complete every queued step of `run` with `outputs` until none is left (it has ended, or
    waits at a gate)."""
    while queued := list(run.steps.filter(state=StepState.QUEUED)):
        for step in queued:
            claim = step_claim(step_id=step.id, worker="test-worker")
            step_succeed(step_id=step.id, attempt=claim.attempt, output=outputs[step.name],
                         usage=Usage(), worker="test-worker")
    return Run.objects.get(pk=run.pk)


@pytest.fixture
def finished_run(refund, editor) -> Run:
    run = finish(run_start(version=refund.active_version, input={"order_id": "ORD-1002", "message": "hi"},
                           actor=editor))
    assert run.state == "completed", [(s.name, s.state) for s in run.steps.all()]
    return run
