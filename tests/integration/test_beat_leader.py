"""More than one beat, safely: real `celery beat` processes on Stepwise's scheduler
(`orchestrator.beat.LeaderScheduler`) contend for the beat leader lease, only the leader sends
the reaper's sweeps and the schedules' ticks, and when the leader is SIGKILLed during a
schedule's slots the follower takes over within the lease — no slot lost, none doubled; a beat
told to stop in the middle of a query stops."""
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction

from orchestrator.beat import LEASE_NAME
from orchestrator.engine.clock import now
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


@pytest.mark.skipif("connection.vendor != 'postgresql'",
                    reason="holds a row lock the beat's query waits on; SQLite locks the whole database")
def test_a_beat_told_to_stop_in_the_middle_of_a_query_stops():
    """Celery's SIGTERM handler closes the scheduler, which releases the lease and writes the
    schedule. Run while the scheduler's own query waited, that close waited for the connection
    the query held, forever."""
    beat = Beat("stopped-mid-query", scheduler="orchestrator.beat:LeaderScheduler",
                env={"STEPWISE_BEAT_LEASE_S": str(LEASE_S)})
    locked, release = threading.Event(), threading.Event()

    def hold_the_lease_row():
        try:
            with transaction.atomic():
                list(Leadership.objects.select_for_update().filter(name=LEASE_NAME))
                locked.set()
                release.wait(60)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_lease_row)
    try:
        # The leader, having sent the reaper's sweeps: its schedule has entries to write.
        wait_for(lambda: holder_pid() == beat.proc.pid and SENT in beat.log.read_text(), timeout=60)
        holder.start()
        assert locked.wait(30)
        wait_for(beat_waits_on_the_lease, timeout=30, interval=0.05)  # its renewal, in flight
        beat.proc.send_signal(signal.SIGTERM)
        time.sleep(1)  # the handler has run, inside the renewal
        release.set()
        try:
            code = beat.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            code = None
        assert code is not None, "beat did not stop within 15 s of its SIGTERM:\n" + beat.log.read_text()[-3000:]
        # Its last close, on a connection of its own, gave the lease up for the next beat.
        assert Leadership.objects.get(name=LEASE_NAME).expires_at <= now()
    finally:
        release.set()
        if holder.is_alive():
            holder.join(30)
        if beat.proc.poll() is None:
            beat.proc.kill()
            beat.proc.wait(30)


def beat_waits_on_the_lease() -> bool:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                       "AND query ILIKE %s AND pid <> pg_backend_pid()", ["%leadership%"])
        return cursor.fetchone()[0] > 0
