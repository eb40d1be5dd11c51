"""The operator's run list: what started each run, when (in words, exactly in the title), for how
long, and named views that come back with the person."""
import re
from datetime import timedelta

import pytest
from django.test import Client

from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role, Run
from tests.factories import SETUP, member

pytestmark = pytest.mark.django_db
ECHO = {"name": "quick-echo", "input_schema": {"type": "object"},
        "steps": [{"name": "say", "type": "tool", "tool": "core.echo", "params": {"said": "hi"}}]}


@pytest.fixture
def runs(team, move_clock):
    version, _ = workflow_save(team=team, definition=ECHO, actor=SETUP)
    starter = member(team, "sam_starter", role=Role.EDITOR)
    mine = run_start(version=version, input={}, actor=starter)
    by_engine = run_start(version=version, input={}, actor=SETUP)
    start = mine.created_at
    Run.objects.filter(id=mine.id).update(started_at=start, finished_at=start + timedelta(seconds=75),
                                          state="completed")
    Run.objects.filter(id=by_engine.id).update(started_at=start, finished_at=None, state="running")
    move_clock(3 * 60 + 5)  # the list is read three minutes later
    return starter, mine, by_engine


def cells(html: str, run: Run) -> dict:
    row = re.search(rf'<tr>(?:(?!</tr>).)*data-run-id="{run.id}"(?:(?!</tr>).)*</tr>', html, re.S)
    assert row, f"no row for {run.id}"
    found = dict(re.findall(r'<td class="field-([a-z_]+)[^"]*">(.*?)</td>', row.group(0), re.S))
    return {name: re.sub(r"<[^>]+>", "", value).strip() for name, value in found.items()} | {
        "created_title": re.search(r'title="([^"]+)"', found["created"]).group(1)}


def test_each_row_says_who_or_what_started_the_run_when_and_for_how_long(team, runs):
    starter, mine, by_engine = runs
    operator = Client()
    operator.force_login(member(team, "olga", role=Role.OPERATOR, staff=True))
    html = operator.get("/admin/orchestrator/run/").content.decode()

    finished, running = cells(html, mine), cells(html, by_engine)
    assert (finished["trigger_column"], finished["started_by"]) == ("api", "sam_starter")
    assert finished["created"] == "3 min ago"
    assert finished["created_title"] == mine.created_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    assert finished["duration"] == "1 min 15 s"
    assert running["started_by"] == "-" and running["duration"] == "3 min 5 s so far"


def test_saved_views_filter_the_list_and_mine_is_the_persons_own(team, runs):
    starter, mine, by_engine = runs
    client = Client()
    starter.is_staff = True
    starter.save()
    client.force_login(starter)

    own = client.get("/admin/orchestrator/run/?view=mine").content.decode()
    active = client.get("/admin/orchestrator/run/?view=active").content.decode()
    assert str(mine.id) in own and str(by_engine.id) not in own
    assert str(by_engine.id) in active and str(mine.id) not in active
    assert "needs a person (waiting, paused)" in own  # the views are offered beside the list


def test_a_run_a_trigger_started_names_the_people_who_set_the_trigger_up(team, move_clock):
    from triggers.services.config import trigger_create
    from triggers.services.firing import trigger_fire_api

    workflow_save(team=team, definition=ECHO, actor=SETUP)
    owner = member(team, "tess_owner", role=Role.OWNER)
    trigger, _ = trigger_create(team=team, kind="api", name="by-tess", workflow=ECHO["name"],
                                actor=owner, input_template={})
    outcome = trigger_fire_api(trigger_id=trigger.id, payload={}, key="k-1", actor=SETUP)
    operator = Client()
    operator.force_login(member(team, "olga", role=Role.OPERATOR, staff=True))

    html = operator.get("/admin/orchestrator/run/").content.decode()

    assert cells(html, outcome.run)["started_by"] == "tess_owner"
