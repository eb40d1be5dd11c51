"""The gauges /metrics reads from the database at scrape time: queue depth and the oldest
queued step's age (engine clock), pending approvals, open alerts, runs by state."""
import pytest
from prometheus_client.parser import text_string_to_metric_families

from alerts.services import alert_raise, alert_resolve
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.operations.metrics import metrics_text
from tests.factories import SETUP

pytestmark = pytest.mark.django_db


def samples() -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(metrics_text().decode())
            for s in family.samples}


def test_queue_depth_and_oldest_age_per_queue_runs_by_state_and_open_alerts(team, move_clock,
                                                                           operator):
    version, _ = workflow_save(team=team, definition={
        "name": "queued", "input_schema": {"type": "object"}, "steps": [
            {"name": "a", "type": "tool", "tool": "core.echo"},
            {"name": "b", "type": "tool", "tool": "core.echo"}]}, actor=SETUP)
    run_start(version=version, input={}, actor=SETUP)
    move_clock(30)
    run_start(version=version, input={}, actor=SETUP)
    move_clock(45)
    alert = alert_raise("run.stuck", team=team, key="k1", subject="Stuck", body="No progress.")
    alert_raise("run.failed", team=team, key="k2", subject="Failed", body="It failed.")
    alert_resolve(alert_id=alert.id, actor=operator)

    seen = samples()
    assert seen[("stepwise_queue_depth", (("capacity", "interactive"), ("queue", "tools")))] == 4
    assert seen[("stepwise_queue_oldest_age_seconds", (("capacity", "interactive"), ("queue", "tools")))] == 45
    assert seen[("stepwise_runs", (("state", "running"),))] == 2
    assert seen[("stepwise_runs", (("state", "failed"),))] == 0
    assert seen[("stepwise_alerts_open", (("rule", "run.failed"), ("severity", "critical")))] == 1
    assert ("stepwise_alerts_open", (("rule", "run.stuck"), ("severity", "warning"))) not in seen
    assert seen[("stepwise_approvals_pending", ())] == 0


def test_a_queue_says_which_capacity_class_it_serves_and_held_runs_are_counted(team):
    keyed, _ = workflow_save(team=team, definition={
        "name": "one-at-a-time", "input_schema": {"type": "object"}, "concurrency": {"key": "all", "limit": 1},
        "steps": [{"name": "a", "type": "tool", "tool": "core.echo"}]}, actor=SETUP)
    for _ in range(3):
        run_start(version=keyed, input={}, actor=SETUP)
    run_start(version=keyed, input={}, actor=SETUP, capacity="evaluation", sandbox={"purpose": "evaluation"})

    seen = samples()
    assert seen[("stepwise_queue_depth", (("capacity", "evaluation"), ("queue", "tools.evaluation")))] == 1
    assert seen[("stepwise_queue_depth", (("capacity", "interactive"), ("queue", "tools")))] == 1
    assert seen[("stepwise_runs_held", ())] == 2


def test_the_scrape_says_how_hard_each_dependency_is_pressed(client, settings, move_clock):
    from django.contrib.auth import get_user_model

    from orchestrator.engine.limits import breaker_record, rate_limit_wait

    # Dependencies of this test's own: no other test calls them, so an open breaker stops nothing.
    settings.STEPWISE_RATE_LIMITS = {"tool:metrics.probe": 5, "tool:metrics.breaker": 100}
    settings.STEPWISE_BREAKER_FAILURES, settings.STEPWISE_BREAKER_COOLDOWN_S = 2, 30
    for _ in range(3):
        assert rate_limit_wait("tool:metrics.probe") == 0
    breaker_record("tool:metrics.breaker", error_class="transient")
    breaker_record("tool:metrics.breaker", error_class="transient")  # the second opens it
    move_clock(10)
    rate_limit_wait("tool:metrics.probe")  # a new second
    client.force_login(get_user_model().objects.create_superuser("root-metrics", "r@example.com", "x"))

    text = client.get("/metrics").content.decode()
    seen = {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}
    probe, broken = (("dependency", "tool:metrics.probe"),), (("dependency", "tool:metrics.breaker"),)
    fast = (("dependency", "model:fast"),)
    assert seen[("stepwise_dependency_calls_per_second", probe)] == 1
    assert seen[("stepwise_dependency_rate_limit", probe)] == 5
    assert seen[("stepwise_dependency_breaker_open_seconds", probe)] == 0
    assert seen[("stepwise_dependency_breaker_open_seconds", broken)] == 20
    assert seen[("stepwise_dependency_failures", broken)] == 2
    assert seen[("stepwise_dependency_calls_per_second", fast)] == 0  # a configured model
    assert ("stepwise_dependency_rate_limit", fast) not in seen  # no limit set
    breaker_record("tool:metrics.breaker", error_class=None)


def test_the_grafana_dashboard_asks_only_for_series_stepwise_exposes():
    import json
    import re
    from pathlib import Path

    from prometheus_client import REGISTRY

    dashboard = json.loads((Path(__file__).resolve().parents[2] / "docs" /
                            "grafana-dashboard.json").read_text())
    asked = {re.sub(r"_(bucket|count|sum|total)$", "", name)
             for panel in dashboard["panels"] for target in panel["targets"]
             for name in re.findall(r"stepwise_[a-z_]+", target["expr"])}
    exposed = {family.name for family in REGISTRY.collect()} | {
        family.name for family in text_string_to_metric_families(metrics_text().decode())}
    assert asked <= exposed, asked - exposed


def test_a_worker_process_given_a_killed_workers_pid_does_not_count_its_step():
    """Pids are reused: a worker child starting under the pid of one killed mid-step finds that
    one's live gauge file. Started as Celery starts a child (`worker_process_init`), it counts
    only its own step: 1, not the dead one's 1 plus its own."""
    import multiprocessing
    import os
    from pathlib import Path

    from celery.signals import worker_process_init
    from prometheus_client.mmap_dict import MmapedDict, mmap_key

    from orchestrator.operations import metrics

    def child(answer):
        path = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]) / f"gauge_livesum_{os.getpid()}.db"
        key = mmap_key("stepwise_steps_executing", "stepwise_steps_executing", ["kind", "queue"],
                       ["tool", "tools"], metrics.EXECUTING._documentation)
        left = MmapedDict(str(path))  # what a worker killed mid-step under this pid left
        left.write_value(key, 1.0, 0.0)
        left.close()
        worker_process_init.send(sender=None)
        with metrics.EXECUTING.labels("tool", "tools").track_inprogress():
            answer.put(dict((k, v) for k, v, _, _ in MmapedDict.read_all_values_from_file(str(path))).get(key))
        path.unlink(missing_ok=True)

    fork = multiprocessing.get_context("fork")
    answer = fork.Queue()
    process = fork.Process(target=child, args=(answer,))
    process.start()
    executing = answer.get(timeout=30)
    process.join(timeout=30)
    assert process.exitcode == 0
    assert executing == 1.0


def test_the_scrape_spanning_every_team_is_for_superusers_and_the_token_only(team, settings):
    """An owner or operator of one team would read every team's runs, tokens and costs."""
    from django.contrib.auth.models import User  # noqa: PLC0415
    from django.test import Client  # noqa: PLC0415

    from orchestrator.models import Role  # noqa: PLC0415
    from tests.conftest import client_for  # noqa: PLC0415
    from tests.factories import member  # noqa: PLC0415

    for role in (Role.MEMBER, Role.EDITOR, Role.OPERATOR, Role.OWNER):
        refused = client_for(member(team, f"a-{role}", role=role, staff=True)).get("/metrics")
        assert refused.status_code == 403, role
        assert "superusers" in refused.json()["errors"][0]["message"]
    assert Client().get("/metrics").status_code == 401
    root = User.objects.create_superuser("root", "root@example.com", "pw")
    assert client_for(root).get("/metrics").status_code == 200
    settings.STEPWISE_METRICS_TOKEN = "scrape-me-0123456789"
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-me-0123456789").status_code == 200
