"""A step's concurrency key in line (engine/services/step_concurrency.py): steps of one key are
claimed in the order they were created, whichever's message a worker takes first — a step whose
message has not been taken yet still counts as ahead in line."""
import pytest
from django.db import transaction

from orchestrator.engine.services.kinds.worker import step_claim
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import StepRun
from tests.factories import SETUP

pytestmark = pytest.mark.django_db


def refund_step(run) -> StepRun:
    return StepRun.objects.get(run=run, name="refund")


def test_a_later_step_whose_message_comes_first_waits_for_the_earlier_one(team):
    version, _ = workflow_save(team=team, actor=SETUP, definition={
        "name": "refund-in-line", "input_schema": {"type": "object"},
        "steps": [{"name": "refund", "type": "tool", "tool": "core.echo", "params": {},
                   "concurrency": {"key": "{{ input.customer }}", "limit": 1}}]})
    with transaction.atomic():
        first, second = (run_start(version=version, input={"customer": "alice"}, actor=SETUP)
                         for _ in range(2))
        other = run_start(version=version, input={"customer": "bob"}, actor=SETUP)

    assert step_claim(step_id=refund_step(second).id, worker="w1") is None
    assert refund_step(second).state == "queued"
    assert refund_step(second).waiting_for == "waiting its turn for concurrency key 'alice' (place 2)"
    assert step_claim(step_id=refund_step(other).id, worker="w1") is not None
    assert step_claim(step_id=refund_step(first).id, worker="w1") is not None
