"""`/metrics` after real work: real Celery worker processes (prefork children) run workflows,
then one scrape of the web side shows every series the workers moved — their counters and
histograms summed across processes (prometheus-client multiprocess mode) — and the gauges read
from the database. The scrape is for operators or the bearer token only."""
import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.models import Role
from orchestrator.services.runs import run_start
from orchestrator.services.workflows import workflow_save
from tests.conftest import client_for
from tests.factories import SETUP, example_definition, member
from tests.support.http_sink import HttpSink

from .conftest import wait_for_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SUPPORT_INPUT = {"ticket_id": "T-1", "body": "Please refund my invoice",
                 "customer_email": "c@example.com"}


def scrape(client) -> dict[tuple, float]:
    response = client.get("/metrics")
    assert response.status_code == 200, response.content[:300]
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(response.content.decode())
            for sample in family.samples}


def settled_scrape(client, *, timeout: float = 60) -> dict[tuple, float]:
    """A scrape once the session's workers are idle: no executor running
    (`stepwise_steps_executing`) and the step counters still for half a second. An earlier
    test's step may still be running on them (a chain carried from one message runs on after
    its test ended, worker.Carry; a call waits for its timeout), and would count as this
    test's."""
    import time

    def steps(samples):
        return total(samples, "stepwise_step_duration_seconds_count")

    last, deadline = scrape(client), time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = scrape(client)
        if steps(now) == steps(last) and total(now, "stepwise_steps_executing") == 0:
            return now
        last = now
    raise AssertionError("the workers never went idle")


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: dict, name: str, **labels) -> float:
    return sum(v for (n, ls), v in samples.items()
               if n == name and all((k, v2) in ls for k, v2 in labels.items()))


def test_metrics_show_what_real_workers_did(workers, team, settings):
    operator = client_for(member(team, "operator", role=Role.OPERATOR))
    before = settled_scrape(operator)

    workflow_save(team=team, definition=example_definition("support"), actor=SETUP)
    started = client_for(member(team, "requester")).post(
        "/api/v1/workflows/support-reply/runs/", {"input": SUPPORT_INPUT}, format="json")
    assert started.status_code == 202
    assert wait_for_run(started.json()["id"], states=("waiting", "failed")).state == "waiting"

    with HttpSink() as sink:
        sink.fail_next(1, 400)
        version, _ = workflow_save(team=team, definition={
            "name": "deliver", "input_schema": {"type": "object"}, "steps": [
                {"name": "deliver", "type": "tool", "tool": "http.request", "side_effect": True,
                 "params": {"method": "POST", "url": f"{sink.url}/deliver", "json": {}}}]},
            actor=SETUP)
        failed = wait_for_run(run_start(version=version, input={}, actor=SETUP).id)
    assert failed.state == "failed"

    after = scrape(operator)
    moved = lambda name, **labels: total(after, name, **labels) - total(before, name, **labels)  # noqa: E731
    assert moved("stepwise_step_duration_seconds_count", kind="agent", outcome="succeeded") == 3
    assert moved("stepwise_step_duration_seconds_count", kind="tool", queue="tools",
                 outcome="failed") == 1
    assert moved("stepwise_step_scheduling_latency_seconds_count", queue="agent.fast") >= 1
    assert moved("stepwise_model_tokens_total", model="fast", direction="in") > 0
    assert moved("stepwise_model_cost_usd_total", model="deep") > 0
    assert moved("stepwise_dead_letters_total", error_class="permanent") == 1
    assert value(after, "stepwise_runs", state="waiting") >= 1
    assert value(after, "stepwise_runs", state="failed") >= 1
    assert value(after, "stepwise_approvals_pending") >= 1

    # Protected: a member is refused, no one anonymous, the bearer token is let in.
    assert client_for(member(team, "viewer")).get("/metrics").status_code == 403
    assert Client().get("/metrics").status_code == 401
    settings.STEPWISE_METRICS_TOKEN = "scrape-me-0123456789"
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-me-0123456789").status_code == 200
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401


def test_steps_executing_counts_a_running_call_and_forgets_a_killed_worker(workers, team):
    """`stepwise_steps_executing` is 1 while a worker's tool call is in progress, and 0 once the
    worker is killed mid-call: a dead process's gauge is dropped at the next scrape."""
    from .conftest import wait_for

    operator = client_for(member(team, "operator", role=Role.OPERATOR))
    settled_scrape(operator)
    executing = lambda: total(scrape(operator), "stepwise_steps_executing", kind="tool", queue="tools")  # noqa: E731
    with HttpSink() as sink:
        sink.hold("/slow")
        version, _ = workflow_save(team=team, definition={
            "name": "slow-call", "input_schema": {"type": "object"}, "steps": [{
                "name": "call", "type": "tool", "tool": "http.request",
                "params": {"method": "POST", "url": f"{sink.url}/slow"}}]}, actor=SETUP)
        run_start(version=version, input={}, actor=SETUP)
        wait_for(lambda: sink.arrivals["/slow"] == 1)
        assert executing() == 1
        workers.kill()
        try:
            wait_for(lambda: executing() == 0, timeout=10)  # as soon as the processes are gone
        finally:
            sink.release("/slow")
            workers.start()
