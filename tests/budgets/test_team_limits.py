"""A team's and a workflow's limits (`BudgetLimit`): new runs refused past a concurrent-run cap or a
spent month, through the API (429 in the one error shape) and through a trigger (refused, or held
and started once the budget allows); a month's spend priced when each call ran, so a price change
mid-month moves what comes after it and nothing before.
"""
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.conf import settings as django_settings

from budgets.models import BudgetLimit, ModelPrice
from budgets.services import budget_limit_create, cost_of, model_price_create
from orchestrator.engine import clock
from orchestrator.engine.errors import BudgetExceeded, Forbidden
from orchestrator.engine.services.kinds.worker import Usage, step_claim, step_succeed
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Run, StepAttempt
from tests.factories import SETUP
from tests.triggers.conftest import deliver, make_trigger
from triggers.models import Firing

pytestmark = pytest.mark.django_db
THINKER = {"name": "thinker", "input_schema": {"type": "object"},
           "steps": [{"name": "think", "type": "agent", "model": "fast", "prompt": "hi",
                      "output_schema": {"type": "object"}}]}


@pytest.fixture
def at(monkeypatch):
    """Set the engine's clock: `at(datetime)`."""
    def move(moment: datetime) -> None:
        monkeypatch.setattr(clock, "_source", lambda: moment)
    return move


def thinker(team):
    return workflow_save(team=team, definition=THINKER, actor=SETUP)[0]


def run_and_spend(version, tokens_in: int, tokens_out: int) -> Run:
    """Start a run and let a worker finish its call, priced as the agent executor prices it."""
    run = run_start(version=version, input={}, actor=SETUP)
    step = run.steps.get()
    claim = step_claim(step_id=step.id, worker="test")
    cost = cost_of(django_settings.STEPWISE_MODELS["fast"], tokens_in, tokens_out, model="fast")
    step_succeed(step_id=step.id, attempt=claim.attempt, output={}, worker="test",
                 usage=Usage(tokens_in=tokens_in, tokens_out=tokens_out, cost_usd=cost, model="fast"))
    return Run.objects.get(pk=run.pk)


def test_a_concurrent_run_cap_refuses_the_next_run_with_a_429(team, api):
    version = thinker(team)
    budget_limit_create(team=team, actor=SETUP, max_concurrent_runs=1)
    run_start(version=version, input={}, actor=SETUP)  # live: its step is queued

    response = api.post("/api/v1/workflows/thinker/runs/", {"input": {}}, format="json")

    assert response.status_code == 429
    assert response.headers["Retry-After"] == "30"
    assert response.json() == {"errors": [{"path": "", "message":
                                           "team 'support' has 1 unfinished runs; its limit is 1"}]}
    assert Run.objects.count() == 1


def test_a_workflow_cap_leaves_the_teams_other_workflows_alone(team):
    version = thinker(team)
    other = workflow_save(team=team, definition={**THINKER, "name": "other"}, actor=SETUP)[0]
    budget_limit_create(team=team, workflow=version.workflow, actor=SETUP, max_concurrent_runs=1)
    run_start(version=version, input={}, actor=SETUP)
    with pytest.raises(BudgetExceeded, match="workflow 'thinker' has 1 unfinished runs"):
        run_start(version=version, input={}, actor=SETUP)
    run_start(version=other, input={}, actor=SETUP)


@pytest.mark.parametrize("month_spent, refused", [
    # 1M tokens in at $0.25 + 0.2M out at $1.25 = $0.50 per run: the cap is $1.00
    (1, False), (2, True),
])
def test_a_spent_month_refuses_new_runs_until_the_next(team, at, month_spent, refused):
    at(datetime(2026, 11, 3, 12, tzinfo=UTC))
    version = thinker(team)
    budget_limit_create(team=team, actor=SETUP, monthly_usd=Decimal("1.00"),
                        effective_from=datetime(2026, 11, 1, tzinfo=UTC))
    for _ in range(month_spent):
        run_and_spend(version, 1_000_000, 200_000)
    if refused:  # exactly the cap is spent: nothing is left for another call
        with pytest.raises(BudgetExceeded, match=r"committed \$1.00 this month; its limit is \$1.00"):
            run_start(version=version, input={}, actor=SETUP)
        at(datetime(2026, 12, 1, 0, 0, 1, tzinfo=UTC))
    assert run_start(version=version, input={}, actor=SETUP).state == "running"


def test_a_mid_month_price_change_prices_later_calls_and_rewrites_none(team, at):
    at(datetime(2026, 11, 2, 9, tzinfo=UTC))
    version = thinker(team)
    model_price_create(model="fast", input_usd_per_mtok=Decimal("0.25"), output_usd_per_mtok=Decimal("1.25"),
                       actor=SETUP, effective_from=datetime(2026, 11, 1, tzinfo=UTC))
    budget_limit_create(team=team, actor=SETUP, monthly_usd=Decimal("1.50"),
                        effective_from=datetime(2026, 11, 1, tzinfo=UTC))
    early = run_and_spend(version, 1_000_000, 200_000)  # $0.50 at the old price
    at(datetime(2026, 11, 15, 9, tzinfo=UTC))
    model_price_create(model="fast", input_usd_per_mtok=Decimal("0.50"), output_usd_per_mtok=Decimal("2.50"),
                       actor=SETUP, effective_from=datetime(2026, 11, 15, tzinfo=UTC))
    late = run_and_spend(version, 1_000_000, 200_000)  # $1.00 at the new one

    assert (early.cost_usd, late.cost_usd) == (Decimal("0.5"), Decimal("1.0"))
    assert StepAttempt.objects.get(step__run=early).cost_usd == Decimal("0.5")  # not re-priced
    assert cost_of({}, 1_000_000, 0, model="fast", at=datetime(2026, 11, 10, tzinfo=UTC)) == Decimal("0.25")
    with pytest.raises(BudgetExceeded, match=r"\$1.50 this month"):  # 0.50 + 1.00: the cap
        run_start(version=version, input={}, actor=SETUP)


def test_a_limit_ended_no_longer_applies_and_a_newer_one_takes_over(team, at):
    at(datetime(2026, 11, 10, tzinfo=UTC))
    version = thinker(team)
    budget_limit_create(team=team, actor=SETUP, max_concurrent_runs=1,
                        effective_from=datetime(2026, 11, 1, tzinfo=UTC),
                        effective_to=datetime(2026, 11, 20, tzinfo=UTC))
    run_start(version=version, input={}, actor=SETUP)
    with pytest.raises(BudgetExceeded):
        run_start(version=version, input={}, actor=SETUP)
    at(datetime(2026, 11, 21, tzinfo=UTC))
    run_start(version=version, input={}, actor=SETUP)
    budget_limit_create(team=team, actor=SETUP, max_concurrent_runs=2)
    with pytest.raises(BudgetExceeded, match="2 unfinished runs; its limit is 2"):
        run_start(version=version, input={}, actor=SETUP)


def test_setting_a_limit_is_audited_and_needs_budget_manage(team, operator):
    from audit.models import AuditEntry

    with pytest.raises(Forbidden):
        budget_limit_create(team=team, actor=operator, monthly_usd=Decimal("10"))
    row = budget_limit_create(team=team, actor=SETUP, monthly_usd=Decimal("10"), warn_at=Decimal("0.9"))
    entry = AuditEntry.objects.get(action="budget.limit_created")
    assert (entry.subject_id, entry.team, entry.actor) == (str(row.id), "support", "service:test-setup")
    assert entry.data["monthly_usd"] == "10" and entry.data["warn_at"] == "0.9"
    assert BudgetLimit.objects.count() == 1
    assert ModelPrice.objects.count() == 0


# --- through a trigger -----------------------------------------------------------------------


@pytest.fixture
def hook(team):
    from tests.factories import example_definition
    workflow_save(team=team, definition=example_definition("support"), actor=SETUP)
    return make_trigger(team, "webhook")


def test_a_trigger_is_refused_with_a_429_when_the_team_cap_is_reached(client, team, hook):
    trigger, secret = hook
    budget_limit_create(team=team, actor=SETUP, max_concurrent_runs=1)
    assert deliver(client, trigger, secret, delivery="d-1").status_code == 202

    refused = deliver(client, trigger, secret, delivery="d-2")

    assert refused.status_code == 429
    assert refused.json()["errors"][0]["message"] == "team 'support' has 1 unfinished runs; its limit is 1"
    assert Run.objects.count() == 1
    assert not Firing.objects.filter(key="delivery:d-2").exists()


def test_a_queueing_trigger_holds_the_firing_until_the_budget_allows(client, team, hook):
    from triggers.services.config import trigger_update
    from triggers.services.firing import queued_firings_admit

    trigger, secret = hook
    trigger_update(trigger_id=trigger.id, actor=SETUP, changes={"when_limited": "queue"})
    budget_limit_create(team=team, actor=SETUP, max_concurrent_runs=1)
    deliver(client, trigger, secret, delivery="d-1")
    Firing.objects.create(trigger=trigger, key="delivery:d-2", state=Firing.State.QUEUED,
                          input=Run.objects.get().input, origin={})

    assert queued_firings_admit() == 0  # the cap holds it; it stays queued
    assert Firing.objects.get(key="delivery:d-2").state == "queued"
    Run.objects.update(state="completed", finished_at=datetime.now(UTC) - timedelta(seconds=1))
    assert queued_firings_admit() == 1
