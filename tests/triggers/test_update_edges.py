"""Changing a trigger at its edges: a change refused whole, another team's workflow, a name in
use, what the ledger records of each kind of change, and when a schedule starts afresh.
Written from the mutation survivors of `triggers/services/config.py` (docs/testing.md)."""
from datetime import timedelta

import pytest

from audit.models import AuditEntry
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role
from tests.factories import SETUP, TeamFactory, example_definition, member
from triggers.models import Trigger
from triggers.services.config import TriggerInvalid, trigger_update

from .conftest import DIGEST, make_trigger

pytestmark = pytest.mark.django_db


@pytest.fixture
def hook(team, support):
    trigger, _ = make_trigger(team, "webhook", name="inbox")
    return trigger


@pytest.fixture
def editor(team):
    return member(team, "ed", role=Role.EDITOR)


def entries(trigger) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(subject_id=str(trigger.id)).exclude(
        action="trigger.created").order_by("id"))


def test_an_invalid_change_is_refused_whole_and_nothing_is_saved(hook, editor):
    with pytest.raises(TriggerInvalid) as refused:
        trigger_update(trigger_id=hook.id, actor=editor,
                       changes={"description": "new", "max_per_minute": 0, "filter": "x >"})
    assert str(refused.value) == "the trigger is invalid"
    assert [p["path"] for p in refused.value.problems] == ["max_per_minute", "filter"]
    hook.refresh_from_db()
    assert (hook.description, hook.max_per_minute, hook.revision) == ("", 60, 1)
    assert entries(hook) == []


def test_a_name_another_trigger_of_the_team_has_is_refused(hook, editor, team):
    make_trigger(team, "webhook", name="other")
    with pytest.raises(TriggerInvalid) as refused:
        trigger_update(trigger_id=hook.id, actor=editor, changes={"name": "other"})
    assert refused.value.problems == [{"path": "name",
                                       "message": "another trigger of the team has it"}]
    assert trigger_update(trigger_id=hook.id, actor=editor, changes={"name": "inbox"}).name == "inbox"


def test_the_workflow_is_named_in_the_triggers_own_team_only(hook, editor, team):
    theirs = TeamFactory(slug="billing", name="Billing")
    definition = {**example_definition("support"), "name": "refunds"}
    workflow_save(team=theirs, definition=definition, actor=SETUP)
    with pytest.raises(TriggerInvalid) as refused:
        trigger_update(trigger_id=hook.id, actor=editor, changes={"workflow": "refunds"})
    assert refused.value.problems == [{"path": "workflow",
                                       "message": "team 'support' has no workflow 'refunds'"}]

    workflow_save(team=team, definition=definition, actor=SETUP)
    moved = trigger_update(trigger_id=hook.id, actor=editor, changes={"workflow": "refunds"})
    assert (moved.workflow.name, moved.workflow.team) == ("refunds", team)


def test_each_kind_of_change_is_recorded_with_what_changed_and_the_revision(hook, editor):
    trigger_update(trigger_id=hook.id, actor=editor, changes={"enabled": False})
    trigger_update(trigger_id=hook.id, actor=editor, changes={"enabled": True})
    trigger_update(trigger_id=hook.id, actor=editor, changes={"description": "tickets",
                                                              "enabled": True})
    trigger_update(trigger_id=hook.id, actor=editor, changes={"description": "tickets"})  # no change

    recorded = [(e.action, e.outcome, e.actor, e.data["changed"], e.data["revision"])
                for e in entries(hook)]
    assert recorded == [
        ("trigger.disabled", "disabled", "user:ed", {"enabled": False}, 2),
        ("trigger.enabled", "enabled", "user:ed", {"enabled": True}, 3),
        ("trigger.updated", "updated", "user:ed", {"description": "tickets"}, 4)]
    hook.refresh_from_db()
    assert (hook.revision, hook.updated_by) == (4, editor)


def test_a_disabled_trigger_changed_otherwise_is_recorded_as_updated(hook, editor):
    trigger_update(trigger_id=hook.id, actor=editor, changes={"enabled": False})
    trigger_update(trigger_id=hook.id, actor=editor, changes={"description": "later"})
    assert [e.action for e in entries(hook)] == ["trigger.disabled", "trigger.updated"]


def test_a_schedule_starts_afresh_when_its_times_change_and_not_otherwise(team, support, frozen):
    trigger, _ = make_trigger(team, "schedule", name="digest", cron="* * * * *",
                              input_template=DIGEST)
    anchor = trigger.schedule_anchor
    Trigger.objects.filter(id=trigger.id).update(last_slot=anchor)
    frozen.advance(minutes=10)

    trigger_update(trigger_id=trigger.id, actor=SETUP, changes={"description": "daily"})
    trigger.refresh_from_db()
    assert (trigger.schedule_anchor, trigger.last_slot) == (anchor, anchor)

    trigger_update(trigger_id=trigger.id, actor=SETUP, changes={"cron": "*/5 * * * *"})
    trigger.refresh_from_db()
    assert trigger.schedule_anchor == anchor + timedelta(minutes=10)
    assert trigger.last_slot is None


def test_a_change_of_other_settings_is_not_refused_for_an_input_the_workflow_no_longer_takes(
        hook, editor, team):
    """Only a change to what decides the input checks it again (INPUT_FIELDS)."""
    definition = example_definition("support")
    definition["input_schema"]["required"] = [*definition["input_schema"]["required"], "priority"]
    definition["input_schema"]["properties"]["priority"] = {"type": "string"}
    workflow_save(team=team, definition=definition, actor=SETUP)

    assert trigger_update(trigger_id=hook.id, actor=editor,
                          changes={"description": "still here"}).description == "still here"
    with pytest.raises(TriggerInvalid) as refused:
        trigger_update(trigger_id=hook.id, actor=editor, changes={"enabled": True,
                                                                  "input_template": {}})
    assert refused.value.problems[0]["path"].startswith("input_template")


def test_a_name_another_team_uses_is_free_for_this_one(hook, editor):
    theirs = TeamFactory(slug="billing", name="Billing")
    workflow_save(team=theirs, definition=example_definition("support"), actor=SETUP)
    make_trigger(theirs, "webhook", name="taken")
    assert trigger_update(trigger_id=hook.id, actor=editor, changes={"name": "taken"}).name == "taken"
