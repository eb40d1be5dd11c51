"""Concurrency keys on real worker processes: 20 runs of one customer, created at once under a
key of limit 1, run one after another in the order they were created — each released by the
`release_held_runs` message its predecessor's end sent through the broker — while another
customer's run goes through at once."""
import pytest
from django.db import transaction

from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, Run
from tests.factories import SETUP

from .conftest import wait_for, wait_for_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

DEFINITION = {
    "name": "refund-one",
    "input_schema": {"type": "object", "required": ["customer"], "properties": {"customer": {"type": "string"}}},
    "concurrency": {"key": "{{ input.customer }}", "limit": 1},
    "steps": [{"name": "look", "type": "tool", "tool": "core.echo", "params": {"customer": "{{ input.customer }}"}},
              {"name": "refund", "type": "tool", "tool": "core.echo", "after": ["look"]}],
}


def test_a_key_of_one_serializes_twenty_runs_of_a_customer_and_lets_another_pass(workers, team):
    version, _ = workflow_save(team=team, definition=DEFINITION, actor=SETUP)
    with transaction.atomic():  # every run exists before the first is sent to a worker
        alice = [run_start(version=version, input={"customer": "alice"}, actor=SETUP) for _ in range(20)]
        bob = run_start(version=version, input={"customer": "bob"}, actor=SETUP)
    assert [r.state for r in alice] == ["running"] + ["pending"] * 19 and bob.state == "running"

    assert wait_for_run(bob.id, states=("completed",)).state == "completed"
    wait_for(lambda: not Run.objects.filter(id__in=[r.id for r in alice]).exclude(state="completed").exists(),
             timeout=120)

    done = sorted(Run.objects.filter(id__in=[r.id for r in alice]), key=lambda r: r.started_at)
    assert [r.id for r in done] == [r.id for r in alice]  # in the order they were started
    overlaps = [(a.id, b.id) for a, b in zip(done, done[1:], strict=False) if b.started_at < a.finished_at]
    assert overlaps == []  # never two of alice's at once
    assert Event.objects.filter(run__in=alice, kind="run.held").count() == 19
    # Bob was not held behind alice: his run ended before alice's last one started.
    assert Run.objects.get(pk=bob.pk).finished_at < done[-1].started_at
