"""`/metrics` after real work: real Celery worker processes (prefork children) run workflows,
then one scrape of the web side shows every series the workers moved — their counters and
histograms summed across processes (prometheus-client multiprocess mode) — and the gauges read
from the database. The scrape is for superusers or the bearer token only."""
import json
import os
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db.models import Q
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role, StepAttempt
from tests.conftest import client_for
from tests.factories import SETUP, example_definition, member
from tests.support.http_sink import HttpSink

from .conftest import WorkerGroup, wait_for_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SUPPORT_INPUT = {"ticket_id": "T-1", "body": "Please refund my invoice",
                 "customer_email": "c@example.com"}


@pytest.fixture(scope="module")
def metered_workers(without_workers, tmp_path_factory):
    """A worker group of this module's own, counting into a metrics directory of its own, the
    session's group stopped meanwhile (`without_workers`): what a scrape shows moved is what
    these tests' runs did, not an earlier test's step finishing late on the session's workers,
    nor a step this test process ran in process (tests/engine), both counted in the session's
    directory."""
    group = WorkerGroup(f"metrics-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}",
                        env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path_factory.mktemp("prometheus"))})
    group.start()
    yield group
    group.stop()


@pytest.fixture
def metered(metered_workers, monkeypatch):
    """This module's worker group, its metrics directory the one `/metrics` reads here."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", metered_workers.env["PROMETHEUS_MULTIPROC_DIR"])
    return metered_workers


def scrape(client) -> dict[tuple, float]:
    response = client.get("/metrics")
    assert response.status_code == 200, response.content[:300]
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(response.content.decode())
            for sample in family.samples}


def settled_scrape(client, *, timeout: float = 60) -> dict[tuple, float]:
    """A scrape once the workers are idle: no executor running (`stepwise_steps_executing`) and
    the step counters still for half a second. An earlier test's step may still be running on
    them (a chain carried from one message runs on after its test ended, worker.Carry; a call
    waits for its timeout), and would count as this test's."""
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


def test_metrics_show_what_real_workers_did(metered, team, settings):
    operator = client_for(User.objects.create_superuser("root", "root@example.com", "pw"))
    before = settled_scrape(operator)
    logged_from = metered.log.stat().st_size
    failures_before = tool_failures_by_process()

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
    # Each tool call that failed on the tools queue is counted once: the deliver call's 400, and
    # any other the database shows: a transient failure retried, or a call that failed after its
    # step had moved on (its attempt closed stale, its error kept).
    failed_calls = StepAttempt.objects.filter(
        Q(outcome="failed") | Q(outcome="stale") & ~Q(error_class=""),
        step__run_id__in=(started.json()["id"], failed.id), step__queue="tools").count()
    assert failed_calls >= 1
    tool_failures = moved("stepwise_step_duration_seconds_count", kind="tool", queue="tools",
                          outcome="failed")
    assert tool_failures == failed_calls, (
        f"{tool_failures} tool failures counted, {failed_calls} recorded; by process (pid: "
        f"before, after; this test's process is {os.getpid()}): "
        f"{moved_by_process(failures_before, tool_failures_by_process())}; the workers logged:\n"
        + failures_logged(metered.log, since=logged_from))
    assert moved("stepwise_step_scheduling_latency_seconds_count", queue="agent.fast") >= 1
    assert moved("stepwise_model_tokens_total", model="fast", direction="in") > 0
    assert moved("stepwise_model_cost_usd_total", model="deep") > 0
    assert moved("stepwise_dead_letters_total", error_class="permanent") == 1
    assert value(after, "stepwise_runs", state="waiting") >= 1
    assert value(after, "stepwise_runs", state="failed") >= 1
    assert value(after, "stepwise_approvals_pending") >= 1

    # Protected: a member and a team's operator are refused, no one anonymous, the bearer token
    # is let in.
    assert client_for(member(team, "viewer")).get("/metrics").status_code == 403
    assert client_for(member(team, "team-op", role=Role.OPERATOR)).get("/metrics").status_code == 403
    assert Client().get("/metrics").status_code == 401
    settings.STEPWISE_METRICS_TOKEN = "scrape-me-0123456789"
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-me-0123456789").status_code == 200
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401


def test_steps_executing_counts_a_running_call_and_forgets_a_killed_worker(metered, team):
    """`stepwise_steps_executing` is 1 while a worker's tool call is in progress, and 0 once the
    worker is killed mid-call: a dead process's gauge is dropped at the next scrape."""
    from .conftest import wait_for

    operator = client_for(User.objects.create_superuser("root", "root@example.com", "pw"))
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
        try:
            wait_for(lambda: executing() == 1, timeout=10)
        except AssertionError:
            raise AssertionError(f"executing {executing()}, not 1, with one call in progress; "
                                 f"by process: {executing_by_process()}") from None
        assert sink.arrivals["/slow"] == 1  # and the one running is the one call: not run twice
        metered.kill()
        try:
            wait_for(lambda: executing() == 0, timeout=10)  # as soon as the processes are gone
        finally:
            sink.release("/slow")
            metered.start()


def failures_logged(log, *, since: int) -> str:
    """The step failures, retries and errors a worker group logged after byte `since` of its
    log."""
    with log.open(errors="replace") as lines:
        lines.seek(since)
        return "".join(line for line in lines
                       if "step." in line and ("ERROR" in line or "WARNING" in line)
                       or "Traceback" in line or "Error:" in line)


def tool_failures_by_process() -> dict[int, float]:
    """Failed tool executions on the tools queue as each process's histogram file holds them."""
    wanted = {"kind": "tool", "queue": "tools", "outcome": "failed"}.items()
    found = {}
    for pid, samples in samples_by_process("histogram_*.db"):
        if counted := sum(value for (name, labels), value in samples
                          if name == "stepwise_step_duration_seconds_bucket" and wanted <= labels.items()):
            found[pid] = counted
    return found


def moved_by_process(before: dict, after: dict) -> dict:
    return {pid: (before.get(pid, 0), count, _command(pid)) for pid, count in after.items()
            if count != before.get(pid, 0)}


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()[:120]
    except OSError:
        return "gone"


def executing_by_process() -> dict:
    """`stepwise_steps_executing` as each process's file holds it: pid -> (its non-zero values,
    its command line or "gone"), to tell which process a count came from."""
    found = {}
    for pid, samples in samples_by_process("gauge_live*_*.db"):
        if values := {tuple(labels.values()): value for (_, labels), value in samples if value}:
            found[pid] = (values, _command(pid))
    return found


def samples_by_process(pattern: str):
    """(pid, [((sample name, labels), value), ...]) of each metrics file named like `pattern`:
    what each process wrote, as prometheus-client's own reader gives it."""
    from prometheus_client.mmap_dict import MmapedDict

    for path in Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]).glob(pattern):
        samples = []
        for key, value, _, _ in MmapedDict.read_all_values_from_file(str(path)):
            _, name, labels, _ = json.loads(key)
            samples.append(((name, labels), value))
        yield int(path.stem.rsplit("_", 1)[1]), samples
