"""The triggers' team quotas become the teams' caps on unfinished runs (budgets migration 0004):
a team without a limit gets one with the quota as its cap; a limit without a cap takes the
quota; of two caps the lower stays, since both refused triggers before."""
import importlib
from types import SimpleNamespace

import pytest
from django.apps import apps as current_apps

from budgets.models import BudgetLimit
from budgets.services import budget_limit_create
from tests.factories import SETUP, TeamFactory

pytestmark = pytest.mark.django_db

migration = importlib.import_module("budgets.migrations.0004_h40a_one_cap_for_unfinished_runs")


class HistoricalApps:
    """The two models the migration reads: the quotas as rows, budgets' limits as they are."""

    def __init__(self, quotas):
        self.quotas = quotas

    def get_model(self, app, name):
        if (app, name) == ("triggers", "TeamQuota"):
            return SimpleNamespace(objects=SimpleNamespace(all=lambda: self.quotas))
        return current_apps.get_model(app, name)


def test_each_quota_becomes_its_teams_cap_on_unfinished_runs(team):
    bare = TeamFactory(slug="bare", name="Bare")
    spend_only = TeamFactory(slug="spend", name="Spend")
    capped_lower = TeamFactory(slug="lower", name="Lower")
    capped_higher = TeamFactory(slug="higher", name="Higher")
    budget_limit_create(team=spend_only, actor=SETUP, daily_usd="5")
    budget_limit_create(team=capped_lower, actor=SETUP, max_concurrent_runs=3)
    budget_limit_create(team=capped_higher, actor=SETUP, max_concurrent_runs=50)
    quotas = [SimpleNamespace(team_id=t.id, max_live_runs=10)
              for t in (bare, spend_only, capped_lower, capped_higher)]

    migration.trigger_quotas_to_team_caps(HistoricalApps(quotas), None)

    caps = {row.team.slug: (row.max_concurrent_runs, str(row.daily_usd) if row.daily_usd else None)
            for row in BudgetLimit.objects.select_related("team")}
    assert caps == {"bare": (10, None), "spend": (10, "5.000000"), "lower": (3, None),
                    "higher": (10, None)}
    assert BudgetLimit.objects.filter(team=team).count() == 0
