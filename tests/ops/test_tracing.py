"""One trace from the API call through the scheduler to the worker's step and its tool call.

The API is called through Django's test client; the messages it sends after commit are taken at
the broker's edge (Celery's `send_task`) and run in this process as a worker would run them
(`Task.apply` with the message's headers, the task signals included), so the in-memory exporter
sees every span. Tracing is on for this test only (STEPWISE_TRACING)."""
import pytest
from celery import current_app
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from orchestrator import tasks
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Run
from orchestrator.operations import tracing
from tests.factories import SETUP

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="session")
def exporter():
    spans = InMemorySpanExporter()
    tracing.configure(exporter=spans)
    return spans


def test_one_trace_links_the_api_call_the_scheduler_the_worker_step_and_the_tool_call(
        team, api, exporter, settings, monkeypatch):
    settings.STEPWISE_TRACING = True
    exporter.clear()
    sent = []
    monkeypatch.setattr(current_app, "send_task",
                        lambda name, args=None, **options: sent.append((name, args, options)))
    workflow_save(team=team, definition={
        "name": "traced", "input_schema": {"type": "object"}, "steps": [
            {"name": "first", "type": "tool", "tool": "core.echo"},
            {"name": "second", "type": "tool", "tool": "core.echo", "after": ["first"]}]},
        actor=SETUP)

    response = api.post("/api/v1/workflows/traced/runs/", {"input": {}}, format="json")
    assert response.status_code == 202
    while sent:  # the worker: each message as delivered, with its headers
        name, args, options = sent.pop(0)
        assert options["headers"]["traceparent"].split("-")[1] == response["X-Trace-Id"]
        getattr(tasks, name.rsplit(".", 1)[-1]).apply(args=args, headers=options["headers"])
    assert Run.objects.get(pk=response.json()["id"]).state == "completed"

    spans = exporter.get_finished_spans()
    names = [s.name for s in spans]
    assert {"POST api:workflow-runs", "scheduler.advance", "task execute_step",
            "step.execute", "tool.call"} <= set(names), names
    assert {format(s.context.trace_id, "032x") for s in spans} == {response["X-Trace-Id"]}
    by_id = {s.context.span_id: s for s in spans}
    tool = next(s for s in spans if s.name == "tool.call")
    chain = []
    while tool is not None:
        chain.append(tool.name)
        tool = by_id.get(tool.parent.span_id) if tool.parent else None
    assert chain[:3] == ["tool.call", "step.execute", "task execute_step"]
    assert chain[-1] == "POST api:workflow-runs"
