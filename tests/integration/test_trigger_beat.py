"""A schedule fired by a real `celery beat` (the database scheduler) and real workers: one run
per slot, even when every tick is delivered twice (a second beat process, and the test sending
each tick again). The beats here run the plain database scheduler, without the leader lease
(`orchestrator.beat`), as two beats by mistake would: the slot keys alone keep one run per slot.
test_beat_leader.py covers the leader lease."""
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.conf import settings

from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Run
from tests.factories import SETUP
from triggers.models import Firing
from triggers.services.config import trigger_create, trigger_update
from triggers.tasks import schedule_fire

from .conftest import ROOT, wait_for, worker_env

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

TICK_LOG = {"name": "tick-log", "input_schema": {
    "type": "object", "required": ["slot"], "properties": {"slot": {"type": "string"}}},
    "steps": [{"name": "note", "type": "tool", "tool": "core.echo",
               "params": {"slot": "{{ input.slot }}"}}]}
INTERVAL_S = 2


class Beat:
    """A real `celery beat` process on the test database."""

    def __init__(self, name: str, *, scheduler: str = "django_celery_beat.schedulers:DatabaseScheduler",
                 env: dict | None = None):
        # One log per beat and test process: parallel test processes never share (or unlink) it.
        self.log = settings.VAR_DIR / f"itest-beat-{name}{settings.XDIST_SUFFIX}.log"
        self.log.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "orchestrator", "beat", "-l", "info",
             "--pidfile=", "--max-interval", "1", "--scheduler", scheduler], cwd=ROOT,
            # INFO: the test reads beat's "Sending due task" lines.
            env={**worker_env(), "STEPWISE_BEAT_LOG_LEVEL": "INFO", **(env or {})},
            stdout=self.log.open("a"), stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period, as a process manager does: on a loaded
        machine a beat was seen to outlive its SIGTERM by minutes, still sending ticks, and what
        these tests check is the runs, not how beat shuts down."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=20)


def test_a_schedule_on_real_beat_starts_one_run_per_slot_even_when_ticks_come_twice(workers, team):
    workflow_save(team=team, definition=TICK_LOG, actor=SETUP)
    trigger, _ = trigger_create(team=team, kind="schedule", name="every-2s", workflow="tick-log",
                                actor=SETUP, interval_s=INTERVAL_S, missed_slots="catch_up",
                                catch_up_max=10, input_template={"slot": "{{ slot }}"})
    beats = [Beat("one"), Beat("two")]  # two beats by mistake: every tick is sent twice
    stop = threading.Event()
    sent = []

    def duplicate_ticks():  # and the broker delivers ticks again, at any moment
        while not stop.wait(0.7):
            schedule_fire.apply_async((str(trigger.id),), queue="orchestrator")
            sent.append(1)

    sender = threading.Thread(target=duplicate_ticks, daemon=True)
    sender.start()
    try:
        # Until both beats have ticked (the duplicate this test is about really happened) and
        # six slots have fired: observable state, not a fixed wait.
        wait_for(lambda: Firing.objects.filter(trigger=trigger).count() >= 6 and all(
            "triggers.tasks.schedule_fire" in beat.log.read_text() for beat in beats),
            timeout=120, interval=0.2)
    finally:
        stop.set()
        sender.join()
        trigger_update(trigger_id=trigger.id, actor=SETUP, changes={"enabled": False})
        for beat in beats:
            beat.stop()
    ticks = sum(beat.log.read_text().count("triggers.tasks.schedule_fire") for beat in beats)
    time.sleep(INTERVAL_S)  # ticks still queued when the schedule was disabled drain

    firings = list(Firing.objects.filter(trigger=trigger).select_related("run").order_by("key"))
    slots = sorted(trigger.schedule_anchor + timedelta(seconds=INTERVAL_S * k)
                   for k in range(1, 1000)
                   if f"slot:{(trigger.schedule_anchor + timedelta(seconds=INTERVAL_S * k)).isoformat()}"
                   in {f.key for f in firings})
    runs = Run.objects.filter(trigger="schedule")
    print(f"beats sent {ticks} ticks and the test {len(sent)} more for {len(slots)} slots")
    assert ticks >= 2 and ticks + len(sent) > 2 * len(slots)  # about every slot ticked twice+
    assert len(slots) == len(firings) == runs.count()  # every firing is a slot: one run each
    assert Counter(runs.values_list("idempotency_key", flat=True)).most_common(1)[0][1] == 1
    assert [b - a for a, b in zip(slots, slots[1:], strict=False)] == \
        [timedelta(seconds=INTERVAL_S)] * (len(slots) - 1)  # no slot lost between them
    assert all(f.run.input == {"slot": f.origin["slot"]} for f in firings)
    wait_for(lambda: not runs.exclude(state="completed").exists(), timeout=60, interval=0.2)
