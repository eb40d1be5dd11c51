"""The gauges /metrics reads from the database at scrape time: queue depth and the oldest
queued step's age (engine clock), pending approvals, open alerts, runs by state."""
import pytest
from prometheus_client.parser import text_string_to_metric_families

from alerts.services import alert_raise, alert_resolve
from orchestrator.metrics import metrics_text
from orchestrator.services.runs import run_start
from orchestrator.services.workflows import workflow_save
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
    assert seen[("stepwise_queue_depth", (("queue", "tools"),))] == 4
    assert seen[("stepwise_queue_oldest_age_seconds", (("queue", "tools"),))] == 45
    assert seen[("stepwise_runs", (("state", "running"),))] == 2
    assert seen[("stepwise_runs", (("state", "failed"),))] == 0
    assert seen[("stepwise_alerts_open", (("rule", "run.failed"), ("severity", "critical")))] == 1
    assert ("stepwise_alerts_open", (("rule", "run.stuck"), ("severity", "warning"))) not in seen
    assert seen[("stepwise_approvals_pending", ())] == 0


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
