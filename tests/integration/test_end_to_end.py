"""End to end through real Celery worker processes, the real broker and the real database."""
import json

import pytest

from approvals.models import ApprovalRequest
from examples.tools import outbox_path
from orchestrator.engine.services.runs import run_cancel, run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import MapItem, Run, StepRun
from tests.conftest import client_for
from tests.factories import SETUP, example_definition, member
from tests.support.http_sink import HttpSink

from .conftest import wait_for, wait_for_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SUPPORT_INPUT = {"ticket_id": "T-1", "body": "Please refund my invoice", "customer_email": "c@example.com"}


def steps_of(run_id) -> dict[str, StepRun]:
    return {s.name: s for s in StepRun.objects.filter(run_id=run_id)}


def test_support_workflow_runs_to_the_gate_and_through_it_after_approval(workers, team):
    requester = member(team, "requester")
    approver = member(team, "lead", groups=("support_leads",))
    api = client_for(requester)
    outbox_path().unlink(missing_ok=True)
    assert api.post("/api/v1/workflows/", example_definition("support"), format="json").status_code == 201

    started = api.post("/api/v1/workflows/support-reply/runs/", {"input": SUPPORT_INPUT}, format="json")
    assert started.status_code == 202
    run_id = started.json()["id"]

    run = wait_for_run(run_id, states=("waiting", "failed"))
    assert run.state == "waiting"
    steps = steps_of(run_id)
    assert {n: s.state for n, s in steps.items()} == {
        "classify": "completed", "research": "completed", "fetch_history": "completed",
        "draft": "completed", "approve": "waiting", "send": "blocked"}
    assert steps["classify"].output == {"category": "billing", "urgency": "high"}
    assert steps["draft"].tokens_in > 0 and run.cost_usd > 0

    approval = ApprovalRequest.objects.get(run_id=run_id)
    decided = client_for(approver).post(f"/api/v1/approvals/{approval.id}/approve/",
                                        {"note": "Offer a 10% voucher",
                                         "proposal_hash": approval.proposal_hash}, format="json")
    assert decided.status_code == 200

    run = wait_for_run(run_id, states=("completed", "failed"))
    assert run.state == "completed"
    sent = [json.loads(line) for line in outbox_path().read_text().splitlines()]
    assert len(sent) == 1
    assert sent[0]["to"] == "c@example.com"
    assert sent[0]["body"].endswith("P.S. Offer a 10% voucher")
    assert sent[0]["idempotency_key"] == f"{run_id}:send:default"


def test_spam_skips_the_rest_of_the_support_workflow(workers, team):
    version, _ = workflow_save(team=team, definition=example_definition("support"), actor=SETUP)
    run = run_start(version=version, input={**SUPPORT_INPUT, "body": "WIN A PRIZE now"}, actor=SETUP)
    run = wait_for_run(run.id, states=("completed", "failed"))
    assert run.state == "completed"
    states = {n: s.state for n, s in steps_of(run.id).items()}
    assert states == {"classify": "completed", "research": "skipped", "fetch_history": "skipped",
                      "draft": "skipped", "approve": "skipped", "send": "skipped"}


def test_map_fans_out_as_a_chord_and_merges_the_items(workers, team):
    version, _ = workflow_save(team=team, definition=example_definition("document-digest"), actor=SETUP)
    docs = [{"id": f"d{i}", "text": f"document number {i}"} for i in range(6)]
    run = run_start(version=version, input={"documents": docs}, actor=SETUP)
    run = wait_for_run(run.id, states=("completed", "failed"))
    assert run.state == "completed", run.error
    summarize = steps_of(run.id)["summarize"]
    assert [o["id"] for o in summarize.output] == [d["id"] for d in docs]
    assert MapItem.objects.filter(step=summarize, done=True).count() == 6
    assert "d5: document number 5" in run.output["digest"]["summaries"]


@pytest.mark.parametrize("score, chosen, skipped", [
    (0.9, "notify_sales", {"nurture", "archive"}),
    (0.6, "nurture", {"notify_sales", "archive"}),
    (0.1, "archive", {"notify_sales", "nurture"}),
])
def test_score_router_takes_one_branch_and_skips_the_others(workers, team, score, chosen, skipped):
    version, _ = workflow_save(team=team, definition=example_definition("lead-routing"), actor=SETUP)
    run = run_start(version=version, input={"company": "ACME", "score": score}, actor=SETUP)
    run = wait_for_run(run.id, states=("completed", "failed"))
    states = {n: s.state for n, s in steps_of(run.id).items()}
    assert run.state == "completed"
    assert states[chosen] == "completed" and states["report"] == "completed"
    assert {n for n, s in states.items() if s == "skipped"} == skipped


def test_sub_workflow_parent_waits_and_takes_the_child_output(workers, team):
    child = {"name": "child", "input_schema": {"type": "object", "required": ["n"]},
             "steps": [{"name": "double", "type": "tool", "tool": "core.echo",
                        "params": {"value": "{{ input.n * 2 }}"}}]}
    parent = {"name": "parent", "input_schema": {"type": "object"},
              "steps": [{"name": "call", "type": "sub_workflow", "workflow": "child",
                         "input": {"n": 21}},
                        {"name": "after", "type": "tool", "tool": "core.echo", "after": ["call"],
                         "params": {"got": "{{ steps.call.output.double.value }}"}}]}
    workflow_save(team=team, definition=child, actor=SETUP)
    version, _ = workflow_save(team=team, definition=parent, actor=SETUP)
    run = run_start(version=version, input={}, actor=SETUP)
    run = wait_for_run(run.id, states=("completed", "failed"))
    assert run.state == "completed", run.error
    assert run.output == {"after": {"got": "42"}}
    child_run = Run.objects.get(parent_step__run=run)
    assert child_run.state == "completed"


def test_transient_http_failures_are_retried_with_the_same_idempotency_key(workers, team):
    with HttpSink() as sink:
        sink.fail_next(2, 500)
        definition = {"name": "poster", "input_schema": {"type": "object"}, "steps": [{
            "name": "post", "type": "tool", "tool": "http.request", "side_effect": True,
            "retry": {"max_attempts": 3, "base_s": 0.05, "max_s": 0.1, "jitter": False},
            "params": {"method": "POST", "url": f"{sink.url}/effects", "json": {"a": 1}}}]}
        version, _ = workflow_save(team=team, definition=definition, actor=SETUP)
        run = run_start(version=version, input={}, actor=SETUP)
        run = wait_for_run(run.id, states=("completed", "failed"))
        assert run.state == "completed", run.error
        step = steps_of(run.id)["post"]
        assert step.attempts == 3
        assert [a.outcome for a in step.attempt_records.all()] == ["failed", "failed", "succeeded"]
        assert [r["key"] for r in sink.requests] == [f"{run.id}:post:default"] * 3
        assert sink.effects == {f"{run.id}:post:default": 1}


def test_permanent_failure_is_not_retried_and_fails_the_run(workers, team):
    with HttpSink() as sink:
        sink.fail_next(1, 400)
        definition = {"name": "bad-request", "input_schema": {"type": "object"}, "steps": [{
            "name": "post", "type": "tool", "tool": "http.request",
            "retry": {"max_attempts": 5, "base_s": 0.05},
            "params": {"method": "POST", "url": f"{sink.url}/x"}}]}
        version, _ = workflow_save(team=team, definition=definition, actor=SETUP)
        run = run_start(version=version, input={}, actor=SETUP)
        run = wait_for_run(run.id, states=("completed", "failed"))
        assert run.state == "failed"
        step = steps_of(run.id)["post"]
        assert step.state == "failed" and step.attempts == 1
        assert step.error["class"] == "permanent"


def test_cancelled_run_with_a_running_step_ends_cancelled_without_starting_anything(workers, team):
    with HttpSink() as sink:
        sink.hold("/think")  # the running step's call is answered only once the cancel is in
        definition = {"name": "slow", "input_schema": {"type": "object"}, "steps": [
            {"name": "think", "type": "tool", "tool": "http.request",
             "params": {"method": "POST", "url": f"{sink.url}/think"}},
            {"name": "next", "type": "tool", "tool": "core.echo", "after": ["think"]}]}
        version, _ = workflow_save(team=team, definition=definition, actor=SETUP)
        run = run_start(version=version, input={}, actor=SETUP)
        wait_for(lambda: sink.arrivals["/think"] == 1)
        assert run_cancel(run_id=run.id, actor=SETUP).state == "cancelling"
        sink.release("/think")
        run = wait_for_run(run.id, states=("cancelled",))
        states = {n: s.state for n, s in steps_of(run.id).items()}
        assert states == {"think": "completed", "next": "cancelled"}


def test_a_run_whose_last_step_was_waiting_completes(workers, team):
    """The run is `waiting` while only a map/gate/child is open; finishing it ends the run."""
    version, _ = workflow_save(team=team, definition={
        "name": "only-map", "input_schema": {"type": "object"},
        "steps": [{"name": "each", "type": "map", "over": "[1, 2, 3]", "item": {
            "type": "tool", "tool": "core.echo", "params": {"n": "{{ item }}"}}}]}, actor=SETUP)
    run = wait_for_run(run_start(version=version, input={}, actor=SETUP).id, states=("completed", "failed"))
    assert run.state == "completed"
    assert run.output == {"each": [{"n": "1"}, {"n": "2"}, {"n": "3"}]}


def test_large_values_cross_worker_processes_as_artifacts(workers, team, settings):
    """A 200 KB document (over the 64 KB default) goes from the run's input to a step, to a map
    over its sections and to the step after: each process writes or reads the one artifact,
    and no row holds the document."""
    from django.db import connection

    sections = [f"Section {i}. " + "terms and conditions " * 500 for i in range(20)]
    version, _ = workflow_save(team=team, definition={
        "name": "large-document", "input_schema": {"type": "object"},
        "steps": [
            {"name": "read", "type": "tool", "tool": "core.echo", "params": {"document": "{{ input.sections | join(' ') }}"}},
            {"name": "each", "type": "map", "after": ["read"], "over": "input.sections", "item": {
                "type": "tool", "tool": "core.echo", "params": {"head": "{{ item[:10] }}", "size": "{{ item | length }}"}}},
            {"name": "total", "type": "tool", "tool": "core.echo", "after": ["each"],
             "params": {"sections": "{{ steps.each.output | length }}", "first": "{{ steps.read.output.document[:9] }}"}},
        ]}, actor=SETUP)
    run = wait_for_run(run_start(version=version, input={"sections": sections}, actor=SETUP).id,
                       states=("completed", "failed"))

    assert run.state == "completed", run.error
    steps = steps_of(run.id)
    assert steps["total"].output == {"sections": "20", "first": "Section 0"}
    assert steps["each"].output[3] == {"head": "Section 3.", "size": str(len(sections[3]))}
    with connection.cursor() as cursor:
        cursor.execute("SELECT MAX(LENGTH(CAST(input AS TEXT))) FROM orchestrator_steprun WHERE run_id = %s",
                       [Run._meta.pk.get_db_prep_value(run.id, connection)])
        longest_input = cursor.fetchone()[0]
    assert longest_input < 4000  # the inputs hold references, not the 200 KB document
    assert any(settings.STEPWISE_ARTIFACTS_DIR.rglob("*.json"))
