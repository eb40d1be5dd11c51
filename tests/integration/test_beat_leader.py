"""More than one beat, safely: real `celery beat` processes on Stepwise's scheduler
(`orchestrator.beat.LeaderScheduler`) contend for the beat leader lease, only the leader sends
the reaper's sweeps and the schedules' ticks, and when the leader is SIGKILLed during a
schedule's slots the follower takes over within the lease — no slot lost, none doubled."""
import os
import signal
from collections import Counter
from datetime import timedelta

import pytest

from orchestrator.beat import LEASE_NAME
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Leadership, Run
from tests.factories import SETUP
from triggers.models import Firing
from triggers.services.config import trigger_create, trigger_update

from .conftest import wait_for
from .test_trigger_beat import TICK_LOG, Beat

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

INTERVAL_S = 2
LEASE_S = 3
SENT = "Sending due task"  # what beat logs (info) for every message it sends


def holder_pid() -> int | None:
    row = Leadership.objects.filter(name=LEASE_NAME).first()
    return int(row.holder.split(":")[1]) if row else None


def test_only_the_leader_beat_sends_and_killing_it_mid_schedule_neither_loses_nor_doubles_a_slot(
        workers, team):
    workflow_save(team=team, definition=TICK_LOG, actor=SETUP)
    trigger, _ = trigger_create(team=team, kind="schedule", name="every-2s", workflow="tick-log",
                                actor=SETUP, interval_s=INTERVAL_S, missed_slots="catch_up",
                                catch_up_max=10, input_template={"slot": "{{ slot }}"})
    lease = {"STEPWISE_BEAT_LEASE_S": str(LEASE_S)}
    beats = {}
    for name in ("leader-one", "leader-two"):
        beat = Beat(name, scheduler="orchestrator.beat:LeaderScheduler", env=lease)
        beats[beat.proc.pid] = beat
    firings = Firing.objects.filter(trigger=trigger)
    try:
        wait_for(lambda: holder_pid() in beats and firings.count() >= 3, timeout=120, interval=0.2)
        leader = beats[holder_pid()]
        follower = next(b for b in beats.values() if b is not leader)
        assert SENT in leader.log.read_text() and "schedule_fire" in leader.log.read_text()
        assert SENT not in follower.log.read_text(), "a follower beat sent a message"
        # Kill the leader right after it fired a slot, with the next ones due while it is gone.
        fired = firings.count()
        wait_for(lambda: firings.count() > fired, timeout=30, interval=0.05)
        os.killpg(leader.proc.pid, signal.SIGKILL)
        leader.proc.wait()
        killed_at = firings.count()
        wait_for(lambda: holder_pid() == follower.proc.pid, timeout=60, interval=0.2)
        wait_for(lambda: firings.count() >= killed_at + 4, timeout=120, interval=0.2)
        assert "schedule_fire" in follower.log.read_text()
    finally:
        trigger_update(trigger_id=trigger.id, actor=SETUP, changes={"enabled": False})
        for beat in beats.values():
            if beat.proc.poll() is None:
                beat.stop()

    keys = list(firings.values_list("key", flat=True))
    slots = sorted(trigger.schedule_anchor + timedelta(seconds=INTERVAL_S * k) for k in range(1, 2000)
                   if f"slot:{(trigger.schedule_anchor + timedelta(seconds=INTERVAL_S * k)).isoformat()}"
                   in set(keys))
    assert len(slots) == len(keys)  # every firing is a slot
    assert [b - a for a, b in zip(slots, slots[1:], strict=False)] == \
        [timedelta(seconds=INTERVAL_S)] * (len(slots) - 1), "a slot was lost in the handover"
    runs = Run.objects.filter(trigger="schedule")
    assert runs.count() == len(slots)
    assert Counter(runs.values_list("idempotency_key", flat=True)).most_common(1)[0][1] == 1
