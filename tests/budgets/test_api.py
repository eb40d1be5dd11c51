"""Budgets through the API: where the money went (/api/v1/costs/), a run's spent / reserved /
remaining in its detail, raising its limit, and the estimate before a run starts."""
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from orchestrator.engine.services.kinds.worker import Usage, step_claim, step_succeed
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import MapItem, Run, StepAttempt
from tests.factories import SETUP, TeamFactory

pytestmark = pytest.mark.django_db


def agent(name, model="fast", after=()):
    return {"name": name, "type": "agent", "model": model, "prompt": "hi", "after": list(after),
            "output_schema": {"type": "object"}}


def spent_run(team, workflow: str, costs: dict[str, str], *, budget=None) -> Run:
    steps = [agent(n, model=m) for n, (m, _) in costs.items()]
    version, _ = workflow_save(team=team, definition={
        "name": workflow, "input_schema": {"type": "object"}, "budget": {"max_cost_usd": budget},
        "steps": steps}, actor=SETUP)
    run = run_start(version=version, input={}, actor=SETUP)
    for name, (model, cost) in costs.items():
        step = run.steps.get(name=name)
        claim = step_claim(step_id=step.id, worker="test")
        step_succeed(step_id=step.id, attempt=claim.attempt, output={}, worker="test",
                     usage=Usage(tokens_in=100, tokens_out=10, cost_usd=Decimal(cost), model=model))
    return run


@pytest.fixture
def spend(team, move_clock):
    spent_run(team, "triage", {"a": ("fast", "0.10"), "b": ("deep", "0.40")})
    spent_run(team, "reply", {"c": ("deep", "1.00")})
    other = TeamFactory(slug="other", name="Other")
    spent_run(other, "secret", {"d": ("deep", "9.00")})  # not visible to the support team


@pytest.mark.parametrize("group_by, expected", [
    ("workflow", [("reply", "1.000000", 1), ("triage", "0.500000", 2)]),
    ("model", [("deep", "1.400000", 2), ("fast", "0.100000", 1)]),
    ("team", [("support", "1.500000", 3)]),
])
def test_costs_grouped_over_the_callers_teams(api, spend, group_by, expected):
    response = api.get(f"/api/v1/costs/?group_by={group_by}")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert [(r["group"], r["cost_usd"], r["calls"]) for r in body["rows"]] == expected
    assert body["total_usd"] == "1.500000"
    assert body["rows"][0]["tokens_in"] == 100 * expected[0][2]


def test_costs_per_day_and_a_range_without_calls(api, spend):
    today = datetime.now(UTC).date()
    body = api.get("/api/v1/costs/").json()
    assert body["group_by"] == "day" and body["to_date"] == str(today)
    assert [(r["group"], r["cost_usd"]) for r in body["rows"]] == [(str(today), "1.500000")]
    assert api.get("/api/v1/costs/?from=2020-01-01&to=2020-01-31").json()["rows"] == []


def test_costs_per_run_and_of_map_items(api, team, spend):
    version, _ = workflow_save(team=team, definition={
        "name": "fan", "input_schema": {"type": "object"}, "steps": [{
            "name": "each", "type": "map", "over": "input.items",
            "item": {"type": "agent", "model": "fast", "prompt": "hi", "output_schema": {"type": "object"}}}]},
        actor=SETUP)
    run = run_start(version=version, input={"items": [1, 2]}, actor=SETUP)
    MapItem.objects.filter(step__run=run).update(attempts=1, done=True, cost_usd=Decimal("0.05"),
                                                 tokens_in=7, finished_at=datetime.now(UTC))
    rows = {r["group"]: r for r in api.get("/api/v1/costs/?group_by=run").json()["rows"]}
    assert rows[str(run.id)]["cost_usd"] == "0.100000" and rows[str(run.id)]["calls"] == 2
    models = {r["group"]: r["cost_usd"] for r in api.get("/api/v1/costs/?group_by=model").json()["rows"]}
    assert models["fast"] == "0.200000"  # 0.10 of an attempt + 2 x 0.05 of map items


def test_by_run_the_report_lists_the_costliest_runs_and_counts_and_totals_them_all(api, team, spend):
    costliest = Run.objects.get(version__workflow__name="reply")
    body = api.get("/api/v1/costs/?group_by=run&limit=1").json()
    assert [(r["group"], r["cost_usd"]) for r in body["rows"]] == [(str(costliest.id), "1.000000")]
    assert body["groups"] == 2 and body["total_usd"] == "1.500000"
    spent_run(team, "many", {f"s{k}": ("fast", "0.01") for k in range(3)})  # one more run
    body = api.get("/api/v1/costs/?group_by=run").json()  # the default lists up to 100
    assert body["groups"] == 3 and len(body["rows"]) == 3
    assert api.get("/api/v1/costs/?group_by=model").json()["groups"] == 2


def test_an_outsider_sees_only_their_team(outsider_api, spend):
    assert [r["group"] for r in outsider_api.get("/api/v1/costs/?group_by=team").json()["rows"]] == ["other"]


@pytest.mark.parametrize("query, path", [
    ("group_by=week", "group_by"), ("from=yesterday", "from"), ("from=2026-02-01&to=2026-01-01", "from"),
    ("from=2024-01-01&to=2025-12-31", "to"), ("group_by=day&group_by=model", "group_by"), ("team=", "team"),
    ("team=a%20b", "team"), ("group_by=day&limit=5", "limit"), ("limit=5", "limit"),
    ("group_by=run&limit=0", "limit"), ("group_by=run&limit=1001", "limit"), ("group_by=run&limit=", "limit"),
])
def test_a_query_the_report_cannot_use_is_a_400_naming_it(api, query, path):
    response = api.get(f"/api/v1/costs/?{query}")
    assert response.status_code == 400
    assert [e["path"] for e in response.json()["errors"]] == [path]


def test_the_run_detail_shows_spent_reserved_and_remaining(api, team):
    run = spent_run(team, "triage", {"a": ("fast", "0.10")}, budget=1.0)
    body = api.get(f"/api/v1/runs/{run.id}/").json()
    assert body["budget"] == {"limit_usd": "1.000000", "spent_usd": "0.100000", "reserved_usd": "0.000000",
                              "remaining_usd": "0.900000", "overridden": False}


def test_an_operator_raises_a_paused_runs_limit_and_it_goes_on(team, operator, settings):
    from tests.conftest import client_for

    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"
    version, _ = workflow_save(team=team, definition={
        "name": "frugal", "input_schema": {"type": "object"}, "budget": {"max_cost_usd": 0.05},
        "steps": [agent("think")]}, actor=SETUP)
    run = run_start(version=version, input={}, actor=SETUP)
    api = client_for(operator)
    paused = api.get(f"/api/v1/runs/{run.id}/").json()
    assert paused["state"] == "paused" and paused["error"]["level"] == "run"

    for reason in (0, True, None, ["needed"]):  # a reason is text, as the schema says
        refused = api.post(f"/api/v1/runs/{run.id}/budget/", {"max_cost_usd": "0.50",
                                                               "reason": reason}, format="json")
        assert refused.status_code == 400 and refused.json()["errors"][0]["path"] == "reason"
    response = api.post(f"/api/v1/runs/{run.id}/budget/", {"max_cost_usd": 999_999, "reason": "x"},
                        format="json")  # the largest limit the schema allows
    assert response.status_code == 202, response.json()
    response = api.post(f"/api/v1/runs/{run.id}/budget/", {"max_cost_usd": "0.50", "reason": "needed"},
                        format="json")

    assert response.status_code == 202
    body = response.json()
    assert body["state"] == "running" and body["steps"][0]["state"] == "queued"
    assert body["budget"] == {"limit_usd": "0.500000", "spent_usd": "0.000000", "reserved_usd": "0.100000",
                              "remaining_usd": "0.400000", "overridden": True}


def test_an_operator_raises_a_run_paused_for_its_duration_and_it_goes_on(team, operator, move_clock):
    from orchestrator.engine.services import reaper
    from tests.conftest import client_for

    version, _ = workflow_save(team=team, definition={
        "name": "slow", "input_schema": {"type": "object"}, "budget": {"max_duration_s": 60},
        "steps": [{"name": "wait", "type": "tool", "tool": "core.echo"}]}, actor=SETUP)
    run = run_start(version=version, input={}, actor=SETUP)
    move_clock(61)
    reaper.reap()
    api = client_for(operator)
    paused = api.get(f"/api/v1/runs/{run.id}/").json()
    assert paused["state"] == "paused" and paused["error"]["level"] == "run.duration"

    nothing = api.post(f"/api/v1/runs/{run.id}/budget/", {"reason": "more time"}, format="json")
    assert nothing.status_code == 400 and nothing.json()["errors"][0]["path"] == "max_cost_usd"
    for bad in (0, -5, "soon", 10**9):
        refused = api.post(f"/api/v1/runs/{run.id}/budget/", {"max_duration_s": bad, "reason": "x"},
                           format="json")
        assert refused.status_code == 400 and refused.json()["errors"][0]["path"] == "max_duration_s"
    response = api.post(f"/api/v1/runs/{run.id}/budget/", {"max_duration_s": 3600, "reason": "more time"},
                        format="json")

    assert response.status_code == 202, response.json()
    body = response.json()
    assert body["state"] == "running"
    assert Run.objects.get(pk=run.pk).budget_overrides.get().max_duration_s == 3600
    assert body["budget"]["overridden"] is False  # the cost limit was not raised


def test_the_estimate_uses_the_reservations_estimator_and_starts_nothing(api, team, settings, move_clock):
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"
    definition = {"name": "plan", "input_schema": {"type": "object"}, "budget": {"max_cost_usd": 0.25},
                  "steps": [agent("first"), {**agent("capped", after=["first"]), "max_cost_usd": 0.05},
                            {"name": "each", "type": "map", "over": "input.items", "after": ["first"],
                             "item": {"type": "agent", "model": "deep", "prompt": "hi",
                                      "output_schema": {"type": "object"}}}]}
    workflow_save(team=team, definition=definition, actor=SETUP)
    before = Run.objects.count()

    response = api.post("/api/v1/workflows/plan/estimate/", {"input": {"items": [1, 2, 3]}}, format="json")

    assert response.status_code == 200, response.json()
    body = response.json()
    assert [(s["step"], s["calls"], s["cost_usd"]) for s in body["steps"]] == [
        ("first", 1, "0.100000"), ("capped", 1, "0.050000"), ("each", 3, "0.300000")]
    assert (body["cost_usd"], body["limit_usd"], body["within_budget"]) == ("0.450000", "0.250000", False)
    assert body["duration_s"] == 0.0  # no past runs yet
    assert Run.objects.count() == before
    assert StepAttempt.objects.count() == 0
    bad = api.post("/api/v1/workflows/plan/estimate/", {"input": []}, format="json")
    assert bad.status_code == 400


# --- limits as records in the API ------------------------------------------------------------


@pytest.fixture
def owner(team):
    from orchestrator.models import Role
    from tests.factories import member
    return member(team, "owner", role=Role.OWNER)


def test_an_owner_records_a_limit_and_members_list_it(team, owner, api):
    from tests.conftest import client_for

    workflow_save(team=team, definition={"name": "triage", "input_schema": {"type": "object"},
                                         "steps": [agent("a")]}, actor=SETUP)
    response = client_for(owner).post("/api/v1/budget-limits/", {
        "workflow": "triage", "monthly_usd": "25", "max_concurrent_runs": 3}, format="json")
    assert response.status_code == 201, response.json()
    created = response.json()
    assert (created["team"], created["workflow"], created["monthly_usd"], created["warn_at"],
            created["created_by"]) == ("support", "triage", "25.000000", "0.800", "owner")
    listed = api.get("/api/v1/budget-limits/").json()["results"]
    assert [row["id"] for row in listed] == [created["id"]]


@pytest.mark.parametrize("body, status, path", [
    ({"workflow": "nope", "monthly_usd": "1"}, 400, "workflow"),
    ({"monthly_usd": "-1"}, 400, "monthly_usd"),
    ({"effective_from": "2026-02-01T00:00:00Z", "effective_to": "2026-01-01T00:00:00Z"}, 400, ""),
])
def test_a_limit_the_service_cannot_record_is_a_400_naming_it(team, owner, body, status, path):
    from tests.conftest import client_for

    response = client_for(owner).post("/api/v1/budget-limits/", body, format="json")
    assert response.status_code == status
    assert [e["path"] for e in response.json()["errors"]] == [path]


def test_a_limit_needs_budget_manage(team, operator):
    from tests.conftest import client_for

    response = client_for(operator).post("/api/v1/budget-limits/", {"monthly_usd": "1"}, format="json")
    assert response.status_code == 403
