"""The admin cost page: a range, team and workflow picked, the daily limit drawn as a line,
and amounts read as money (two decimals; significant digits under a cent)."""
import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client

from budgets.services import budget_limit_create
from orchestrator.engine.clock import now
from orchestrator.models import Role
from tests.factories import SETUP, TeamFactory, member

from .test_api import spent_run

pytestmark = pytest.mark.django_db
PAGE = "/admin/budgets/costreport/"


@pytest.fixture
def owner_client(team):
    client = Client()
    client.force_login(member(team, "boss", role=Role.OWNER, staff=True))
    return client


@pytest.fixture
def spend(team):
    spent_run(team, "triage", {"a": ("fast", "0.10"), "b": ("deep", "0.40")})
    spent_run(team, "reply", {"c": ("deep", "0.000420")})
    spent_run(TeamFactory(slug="other", name="Other"), "secret", {"d": ("deep", "9.00")})


def test_amounts_read_as_money_and_the_teams_daily_limit_is_drawn(owner_client, team, spend):
    budget_limit_create(team=team, actor=SETUP, daily_usd=Decimal("5"))

    response = owner_client.get(PAGE)

    html = response.content.decode()
    assert '<strong class="cost-total">$0.50</strong>' in html  # 0.500420, two decimals
    assert ">$0.00042</td>" in html  # under a cent: its significant digits
    shown = re.sub(r"<[^>]+>", " ", html)  # the text read; a cell's title keeps the exact amount
    assert "0.500000" not in shown and "0.000420 " not in shown
    chart = response.context["chart"]
    assert len(chart["labels"]) == 30 and chart["limit"] == 5.0  # one team: its limit
    assert "Daily limit: <strong>$5.00</strong>" in html
    assert "secret" not in html  # another team's


def test_a_range_a_workflow_and_a_team_are_picked(owner_client, team, spend):
    today = now().date()
    since = today - timedelta(days=6)

    response = owner_client.get(PAGE, {"since": since.isoformat(), "until": today.isoformat(),
                                       "team": "support", "workflow": "triage"})

    assert response.status_code == 200
    assert response.context["chart"]["labels"] == [str(since + timedelta(days=i)) for i in range(7)]
    assert [row["group"] for row in response.context["by_workflow"]] == ["triage"]
    assert response.context["total"] == "$0.50"
    assert '<option value="triage" selected>triage</option>' in response.content.decode()


def test_a_range_that_ends_before_it_starts_says_so(owner_client, spend):
    response = owner_client.get(PAGE, {"since": "2026-05-02", "until": "2026-05-01"})

    assert "The range starts after it ends." in response.content.decode()
    assert len(response.context["chart"]["labels"]) == 30  # the defaults meanwhile
