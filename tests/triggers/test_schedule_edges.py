"""Schedules at their edges: what the ledger records of skipped slots, a slot refused and the
alert it raises, a tick for no schedule, and the next slots shown while a schedule is edited.
Written from the mutation survivors of `triggers/services/schedules.py` (docs/testing.md)."""
import uuid
from datetime import timedelta

import pytest

from alerts.models import Alert, AlertRule
from alerts.rules import RuleKind
from audit.models import AuditEntry
from orchestrator.engine.services.workflows import workflow_save
from tests.factories import SETUP, example_definition
from triggers.models import Firing
from triggers.services.config import trigger_update
from triggers.services.schedules import next_slots, schedule_tick
from triggers.slots import Schedule

from .conftest import DIGEST, make_trigger

pytestmark = pytest.mark.django_db


@pytest.fixture
def every_minute(team, support, frozen):
    frozen.moment = frozen.moment.replace(second=30)
    trigger, _ = make_trigger(team, "schedule", name="digest", cron="* * * * *",
                              timezone="UTC", input_template=DIGEST)
    return trigger


def test_skipped_slots_are_recorded_by_the_trigger_with_the_policy_and_the_first_and_last(
        every_minute, frozen):
    trigger_update(trigger_id=every_minute.id, actor=SETUP,
                   changes={"missed_slots": "skip", "catch_up_max": 3})
    frozen.advance(minutes=5)
    schedule_tick(trigger_id=every_minute.id)

    # Of this trigger: earlier transactional tests' entries stay in PostgreSQL's ledger.
    entry = AuditEntry.objects.get(action="trigger.slots_skipped", actor=f"trigger:{every_minute.id}")
    newest = frozen.moment.replace(second=0)
    assert (entry.actor, entry.outcome) == (f"trigger:{every_minute.id}", "skipped")
    assert {key: entry.data[key] for key in ("count", "policy", "first", "last")} == {
        "count": 4, "policy": "skip", "first": (newest - timedelta(minutes=4)).isoformat(),
        "last": (newest - timedelta(minutes=1)).isoformat()}


def require_priority(team):
    """A new version of the workflow whose input the schedule's template no longer gives."""
    definition = example_definition("support")
    schema = definition["input_schema"]
    schema["required"] = [*schema["required"], "priority", "channel"]
    schema["properties"].update(priority={"type": "string"}, channel={"type": "string"})
    workflow_save(team=team, definition=definition, actor=SETUP)


def test_a_refused_slot_keeps_its_slot_and_alerts_the_team_with_every_reason(
        every_minute, frozen, team):
    require_priority(team)
    frozen.advance(seconds=31)

    [outcome] = schedule_tick(trigger_id=every_minute.id)

    slot = frozen.moment.replace(second=0).isoformat()
    firing = Firing.objects.get()
    assert (firing.state, firing.reason, firing.origin) == ("refused", "invalid_input",
                                                            {"slot": slot})
    alert = Alert.objects.get()
    reasons = "; ".join(f"{p['path']}: {p['message']}" for p in outcome.problems)
    assert len(outcome.problems) == 2 and all(p["path"] for p in outcome.problems)
    assert alert.body == (f"The slot {slot} of schedule 'digest' (workflow 'support-reply') "
                          f"started no run: {reasons}. Its next slots are refused the same way "
                          "until the trigger or the workflow is fixed; the trigger's firings "
                          "list each refused slot.")


def test_a_refused_slot_raises_no_alert_where_the_workflows_rule_is_off(every_minute, frozen, team):
    AlertRule.objects.create(kind=RuleKind.TRIGGER_REFUSED, team=team,
                             workflow=every_minute.workflow, enabled=False)
    require_priority(team)
    frozen.advance(seconds=31)
    schedule_tick(trigger_id=every_minute.id)
    assert Firing.objects.get().state == "refused"
    assert not Alert.objects.exists()


def test_a_tick_for_no_schedule_fires_nothing(every_minute, frozen):
    frozen.advance(seconds=31)
    assert schedule_tick(trigger_id=uuid.uuid4()) == []
    assert not Firing.objects.exists()


def test_an_edited_interval_schedule_shows_slots_from_now_and_after_the_last_one_run(frozen):
    moment = frozen.moment
    edited = Schedule(timezone="Europe/Paris", interval_s=60)

    slots, problems = next_slots(edited, count=2)
    assert problems == []
    assert [s["at"] for s in slots] == [(moment + timedelta(seconds=60 * k)).isoformat()
                                        for k in (1, 2)]
    assert slots[0]["label"].endswith(("CET", "CEST"))

    later, _ = next_slots(edited, last_slot=moment + timedelta(seconds=90), count=1)
    assert later[0]["at"] == (moment + timedelta(seconds=120)).isoformat()

    saved = Schedule(interval_s=60, anchor=moment - timedelta(seconds=30))
    on_its_anchor, _ = next_slots(saved, count=1)
    assert on_its_anchor[0]["at"] == (moment + timedelta(seconds=30)).isoformat()


def test_a_slots_template_reads_the_slot_in_utc(team, support, frozen):
    frozen.moment = frozen.moment.replace(second=30)
    trigger, _ = make_trigger(team, "schedule", name="utc", cron="* * * * *",
                              timezone="Europe/Paris", input_template={
                                  **DIGEST, "ticket_id": "digest-{{ slot_utc }}"})
    frozen.advance(seconds=31)
    [outcome] = schedule_tick(trigger_id=trigger.id)
    slot = frozen.moment.replace(second=0)
    assert outcome.run.input["ticket_id"] == f"digest-{slot.isoformat()}"


def test_a_slot_refused_by_its_rate_alerts_with_the_limits_words(every_minute, frozen):
    trigger_update(trigger_id=every_minute.id, actor=SETUP, changes={
        "max_per_minute": 1, "missed_slots": "catch_up", "catch_up_max": 3})
    frozen.advance(minutes=2)
    outcomes = schedule_tick(trigger_id=every_minute.id)
    assert [o.status for o in outcomes] == ["started", "refused"]
    assert Alert.objects.get().body.split("started no run: ")[1].startswith(
        "trigger 'digest' started 1 runs in the last minute")
