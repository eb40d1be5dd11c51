"""The operations page's steps waiting now, by kind, with each kind's longest wait
(orchestrator/operations/overview.py: `waiting_steps`): every waiting kind counted the same
way, only the person's teams, in one query over the index of waiting steps."""
import pytest
from django.db import connection
from django.urls import reverse
from django.utils.dateparse import parse_datetime

from orchestrator.engine.clock import now
from orchestrator.engine.services.runs import run_cancel, run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role, StepRun
from orchestrator.operations.overview import waiting_steps, waiting_steps_counted
from tests.factories import SETUP, TeamFactory, UserFactory, member

pytestmark = pytest.mark.django_db

ECHO = {"name": "after", "type": "tool", "tool": "core.echo", "params": {}}


def workflow(team, name: str, first: dict):
    """A workflow whose first step is `first`, then an echo step."""
    version, _ = workflow_save(team=team, actor=SETUP, definition={
        "name": name, "input_schema": {"type": "object"},
        "steps": [{"name": "first", **first}, {**ECHO, "after": ["first"]}]})
    return version


def gated(team):
    return workflow(team, "gated", {"type": "human_gate", "approvers": "support_leads"})


def napping(team):
    return workflow(team, "napping", {"type": "sleep", "for_s": 3600})


def state_for(client, user) -> dict:
    client.force_login(user)
    return client.get(reverse("admin:orchestrator_operations_state")).json()


def test_waiting_steps_are_counted_by_kind_with_the_age_of_each_kind_s_oldest_wait(
        client, team, operator, move_clock):
    gate, nap = gated(team), napping(team)
    first_gate = run_start(version=gate, input={}, actor=SETUP)
    move_clock(5)
    run_start(version=nap, input={}, actor=SETUP)
    move_clock(20)
    run_start(version=gate, input={}, actor=SETUP)
    run_start(version=workflow(team, "busy", {"type": "tool", "tool": "core.echo", "params": {}}),
              input={}, actor=SETUP)  # its step is queued, not waiting: not counted
    move_clock(65)

    waits = state_for(client, operator)["waiting_steps"]
    assert [(w["kind"], w["waiting"], w["oldest_age_s"]) for w in waits] == [
        ("human_gate", 2, 65), ("sleep", 1, 60)]
    since = StepRun.objects.get(run=first_gate, name="first").started_at
    assert parse_datetime(waits[0]["oldest_since"]) == since.replace(  # JSON keeps milliseconds
        microsecond=since.microsecond // 1000 * 1000)

    run_cancel(run_id=first_gate.id, actor=SETUP, reason="no longer needed")
    waits = state_for(client, operator)["waiting_steps"]
    assert [(w["kind"], w["waiting"], w["oldest_age_s"]) for w in waits] == [
        ("human_gate", 1, 45), ("sleep", 1, 60)]


def test_a_member_sees_the_waits_of_their_own_teams_only(client, team, operator):
    other = TeamFactory(slug="other")
    theirs = member(other, "their-operator", role=Role.OPERATOR, staff=True)
    run_start(version=gated(team), input={}, actor=SETUP)
    run_start(version=napping(other), input={}, actor=SETUP)
    run_start(version=napping(other), input={}, actor=SETUP)

    def kinds(user) -> dict:
        return {w["kind"]: w["waiting"] for w in state_for(client, user)["waiting_steps"]}

    assert kinds(operator) == {"human_gate": 1}
    assert kinds(theirs) == {"sleep": 2}
    both = member(other, "operator-of-both", role=Role.OPERATOR, staff=True)
    member(team, "operator-of-both", role=Role.OPERATOR)
    assert kinds(both) == {"human_gate": 1, "sleep": 2}
    assert kinds(UserFactory(username="root", is_staff=True, is_superuser=True)) == {
        "human_gate": 1, "sleep": 2}
    assert kinds(member(TeamFactory(slug="third"), "stranger", staff=True)) == {}


def test_the_count_is_one_query(team, operator, django_assert_num_queries):
    run_start(version=gated(team), input={}, actor=SETUP)
    run_start(version=napping(team), input={}, actor=SETUP)
    with django_assert_num_queries(1):
        assert len(waiting_steps(user=operator, at=now())) == 2


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's plan")
def test_the_count_reads_the_index_of_waiting_steps(team, operator):
    run_start(version=gated(team), input={}, actor=SETUP)
    with connection.cursor() as cursor:  # a handful of rows: make the planner show its choice
        cursor.execute("SET LOCAL enable_seqscan = off")
    for user in (operator, UserFactory(username="root", is_superuser=True)):
        assert "step_waiting_kind" in waiting_steps_counted(user).explain()
