"""Schedules: the beat entry they keep, and one run per slot whatever the ticks do."""
from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest
from django_celery_beat.models import PeriodicTask, PeriodicTasks

from audit.models import AuditEntry
from orchestrator.models import Run
from tests.factories import SETUP
from triggers.models import Firing, Trigger
from triggers.services.config import TriggerInvalid, trigger_update
from triggers.services.schedules import schedule_tick
from triggers.tasks import schedule_fire

from .conftest import DIGEST, make_trigger

pytestmark = pytest.mark.django_db


@pytest.fixture
def every_minute(team, support, frozen):
    frozen.moment = frozen.moment.replace(second=30)
    trigger, _ = make_trigger(team, "schedule", name="digest", cron="* * * * *",
                              timezone="Europe/Paris", input_template=DIGEST)
    return trigger


def test_a_schedule_keeps_a_beat_entry_in_its_time_zone_that_follows_every_change(team, support):
    trigger, secret = make_trigger(team, "schedule", name="nightly", cron="0 3 * * mon-fri",
                                   timezone="Europe/Paris", input_template=DIGEST)
    task = PeriodicTask.objects.get(stepwise_trigger=trigger)
    assert secret is None
    assert (task.task, task.queue, task.args, task.enabled) == (
        "triggers.tasks.schedule_fire", "orchestrator", f'["{trigger.id}"]', True)
    assert (task.crontab.minute, task.crontab.hour, task.crontab.day_of_week,
            str(task.crontab.timezone)) == ("0", "3", "mon-fri", "Europe/Paris")

    changed_before = PeriodicTasks.last_change()
    trigger_update(trigger_id=trigger.id, actor=SETUP, changes={"cron": None, "interval_s": 30})
    task.refresh_from_db()
    assert task.crontab is None and task.interval.every == 30
    assert PeriodicTasks.last_change() > changed_before  # beat reloads without a restart
    trigger_update(trigger_id=trigger.id, actor=SETUP, changes={"enabled": False})
    task.refresh_from_db()
    assert task.enabled is False


def test_a_tick_starts_one_run_for_its_slot_and_a_duplicate_tick_starts_nothing(every_minute, frozen):
    frozen.advance(seconds=31)  # hh:mm:01, one second after a slot
    schedule_fire(str(every_minute.id))
    schedule_fire(str(every_minute.id))  # the same tick delivered twice
    frozen.advance(seconds=5)
    schedule_fire(str(every_minute.id))  # a tick late by a few seconds

    run = Run.objects.get()
    slot = frozen.moment.replace(second=0)
    assert run.trigger_firing.key == f"slot:{slot.isoformat()}"
    assert run.idempotency_key == f"trigger:{every_minute.id}:slot:{slot.isoformat()}"
    # The slot in the schedule's zone: Paris is UTC+1 in winter, UTC+2 in summer.
    paris = slot.astimezone(ZoneInfo("Europe/Paris")).isoformat()
    assert paris.endswith(("+01:00", "+02:00"))
    assert run.input["body"] == f"Daily digest at {paris}"
    frozen.advance(minutes=1)
    schedule_fire(str(every_minute.id))
    assert Run.objects.count() == 2


def test_on_time_ticks_remember_their_slot_and_skip_nothing(every_minute, frozen):
    """Each tick saves the slot it handled, so the next one plans from there: three on-time
    ticks run three slots and no slot is reported skipped."""
    slots = []
    for _ in range(3):
        frozen.advance(minutes=1)
        slot = frozen.moment.replace(second=0)
        assert [o.status for o in schedule_tick(trigger_id=every_minute.id)] == ["started"]
        every_minute.refresh_from_db()
        assert every_minute.last_slot == slot
        slots.append(slot)

    assert not AuditEntry.objects.filter(action="trigger.slots_skipped").exists()
    assert sorted(Firing.objects.values_list("key", flat=True)) == [
        f"slot:{slot.isoformat()}" for slot in slots]
    assert slots[-1] - slots[0] == timedelta(minutes=2)


def test_a_replayed_tick_for_a_slot_already_run_finds_its_firing(every_minute, frozen):
    frozen.advance(seconds=31)
    first = schedule_tick(trigger_id=every_minute.id)
    Trigger.objects.filter(id=every_minute.id).update(last_slot=None)  # as if it were lost
    again = schedule_tick(trigger_id=every_minute.id)

    assert [o.status for o in first] == ["started"]
    assert [o.status for o in again] == ["duplicate"] and again[0].run == first[0].run
    assert Run.objects.count() == 1


@pytest.mark.parametrize("policy, catch_up, runs, skipped", [
    ("skip", 3, 1, 4),
    ("catch_up", 3, 4, 1),
    ("catch_up", 100, 5, 0),
])
def test_slots_missed_while_beat_was_down_follow_the_schedule_policy(
        every_minute, frozen, policy, catch_up, runs, skipped):
    trigger_update(trigger_id=every_minute.id, actor=SETUP,
                   changes={"missed_slots": policy, "catch_up_max": catch_up})
    frozen.advance(minutes=5)  # beat was down: five slots passed, none ticked
    schedule_tick(trigger_id=every_minute.id)

    assert Run.objects.count() == runs
    entries = AuditEntry.objects.filter(action="trigger.slots_skipped")
    assert [e.data["count"] for e in entries] == ([skipped] if skipped else [])
    frozen.advance(minutes=1)
    schedule_tick(trigger_id=every_minute.id)
    assert Run.objects.count() == runs + 1  # back on time: the next slot, once


def test_slots_passed_while_disabled_are_not_missed_when_it_is_enabled_again(every_minute, frozen):
    trigger_update(trigger_id=every_minute.id, actor=SETUP,
                   changes={"enabled": False, "missed_slots": "catch_up"})
    frozen.advance(minutes=10)
    assert schedule_tick(trigger_id=every_minute.id) == []
    trigger_update(trigger_id=every_minute.id, actor=SETUP, changes={"enabled": True})
    frozen.advance(seconds=31)
    schedule_tick(trigger_id=every_minute.id)
    assert Run.objects.count() == 1
    assert not AuditEntry.objects.filter(action="trigger.slots_skipped").exists()


def test_a_bad_schedule_is_refused_whole_with_every_problem(team, support):
    with pytest.raises(TriggerInvalid) as refused:
        make_trigger(team, "schedule", name="bad", cron="0 25 * *", timezone="Nowhere/City",
                     input_template={"x": "{{ oops( }}"}, filter="slot >", replay_window_s=5)
    paths = {p["path"] for p in refused.value.problems}
    assert paths == {"replay_window_s"}  # a webhook setting: refused before anything else
    with pytest.raises(TriggerInvalid) as refused:
        make_trigger(team, "schedule", name="bad", cron="0 25 * *", timezone="Nowhere/City",
                     input_template={"x": "{{ oops( }}"}, filter="slot >")
    assert {p["path"] for p in refused.value.problems} == {
        "cron", "timezone", "input_template.x", "filter"}
    assert not Trigger.objects.exists() and not PeriodicTask.objects.filter(
        task="triggers.tasks.schedule_fire").exists()
    assert not Firing.objects.exists()
