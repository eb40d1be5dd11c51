"""The bench's evaluation phase (bench/scale.py: evaluation_beside_live), run with tiny numbers on
the whole stack so that it cannot rot: real worker processes on every queue (the evaluation ones
included), the web process over HTTP for the live runs (bench/measure.py: idle_runs, as the
bench starts them), an evaluation of 6 cases whose budget is spent after half of them."""
from decimal import Decimal

import pytest
from rest_framework.authtoken.models import Token

from bench import scale
from bench.measure import chain_definition, idle_runs
from bench.stats import evaluation_rows
from orchestrator.engine.services.workflows import workflow_save
from tests.factories import member
from tests.support.live_server import LiveServer

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_a_budget_is_the_share_of_what_every_case_would_cost_and_at_least_one_run():
    assert scale.evaluation_budget(Decimal("0.001"), cases=1000, share=0.65) == Decimal("0.65")
    assert scale.evaluation_budget(Decimal("0.001"), cases=6, share=0.5) == Decimal("0.003")
    assert scale.evaluation_budget(Decimal("0.001"), cases=1, share=0.1) == Decimal("0.001")


def test_the_cases_are_in_three_tiers_and_every_other_one_declares_its_email():
    cases = scale.evaluation_cases(range(4))
    assert [c["key"] for c in cases] == ["case-00000", "case-00001", "case-00002", "case-00003"]
    assert [c["risk_tier"] for c in cases] == ["low", "medium", "high", "low"]
    assert ["responses" in c for c in cases] == [True, False, True, False]


def test_the_phase_stops_the_evaluation_at_its_budget_and_measures_live_runs_meanwhile(workers, team):
    owner = member(team, "bench", role="owner")
    token = Token.objects.create(user=owner).key
    workflow_save(team=team, definition=chain_definition("bench-chain", 3), actor=owner)
    version, _ = workflow_save(team=team, definition=scale.evaluation_definition("bench-eval"), actor=owner)
    server = LiveServer("bench-evaluation").start()
    try:
        phase = scale.evaluation_beside_live(
            version, owner=owner, cases=6, concurrency=2, budget_share=0.5,
            live=lambda stop: idle_runs(server.url, token, "bench-chain", runs=50, steps=3, warmup=0,
                                        deadline=_in(120), check=lambda: None, stop=stop),
            deadline=_in(180), check=lambda: None, control_s=1)
    finally:
        server.stop()

    assert phase["state"] == "stopped", phase["stop_reason"]
    assert not phase["cancelled_at_deadline"]
    assert phase["budget_usd"] == "0.003000" and phase["cost_per_run_usd"] == "0.001"
    # The runs in flight when the budget was reached may spend past it, at most one each.
    assert 0 <= Decimal(phase["overshoot_usd"]) <= 2 * Decimal("0.001")
    assert 3 <= phase["runs"] <= 5 and phase["case_states"].get("not_run", 0) == 6 - phase["runs"]
    assert phase["sandboxed_effects"] >= 1 and phase["emails_reaching_the_outbox"] == 0
    live, control = phase["live"], phase["control"]
    assert live["runs"] >= 1 and live["step_latency_ms"]["n"] == 2 * live["runs"]
    assert control["runs"] >= 1 and control["step_latency_ms"]["n"] == 2 * control["runs"]

    lines: list[str] = []
    evaluation_rows("embedded", {"start": live, "evaluation": {**phase, "live_vs_idle": {}}},
                    lambda *row: lines.append(" ".join(map(str, row[:2]))), lines)
    assert any("evaluation  stopped after" in line for line in lines)


def _in(seconds: float) -> float:
    import time

    return time.time() + seconds
