"""Sleep steps on the whole stack: real worker processes, a real `celery beat` on Stepwise's
scheduler sending the reaper's sweeps, the real broker and database. A run that sleeps holds no
worker; SIGKILL every process while it sleeps, bring them back after its time, and it wakes and
completes once — with the test process sweeping too, a second reaper racing beat's. A run
cancelled while it sleeps ends without waking."""

import os
import signal

import pytest

from orchestrator.engine.clock import now
from orchestrator.engine.services import reaper
from orchestrator.engine.services.runs import run_cancel, run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, Run, StepRun
from tests.factories import SETUP

from .conftest import wait_for, wait_for_run
from .test_trigger_beat import Beat

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

NAP_S = 3
ENDED = ("completed", "failed", "cancelled", "timed_out")


def napper(team, nap_s: int = NAP_S):
    version, _ = workflow_save(
        team=team,
        definition={
            "name": "napper",
            "input_schema": {"type": "object"},
            "steps": [
                {"name": "before", "type": "tool", "tool": "core.echo", "params": {"at": "start"}},
                {"name": "nap", "type": "sleep", "for_s": nap_s, "after": ["before"]},
                {
                    "name": "after",
                    "type": "tool",
                    "tool": "core.echo",
                    "after": ["nap"],
                    "params": {"slept_until": "{{ steps.nap.output.slept_until }}"},
                },
            ],
        },
        actor=SETUP,
    )
    return version


def sleeping(run_id) -> StepRun | None:
    return StepRun.objects.filter(run_id=run_id, name="nap", state="waiting").first()


def test_a_run_sleeps_across_a_whole_stack_sigkill_and_wakes_once(workers, team):
    lease = {"STEPWISE_BEAT_LEASE_S": "3"}
    beat = Beat("sleep-one", scheduler="orchestrator.beat:LeaderScheduler", env=lease)
    restarted = None
    try:
        run = run_start(version=napper(team), input={}, actor=SETUP)
        nap = wait_for(lambda: sleeping(run.id), timeout=60)
        assert Run.objects.get(id=run.id).state == "waiting"

        # The whole stack dies while the run sleeps, and stays down past its wake-up time.
        workers.kill()
        os.killpg(beat.proc.pid, signal.SIGKILL)
        beat.proc.wait()
        wait_for(lambda: now() > nap.wake_at, timeout=NAP_S + 5)
        assert sleeping(run.id), "something woke the step while every process was down"

        workers.start()
        restarted = Beat("sleep-two", scheduler="orchestrator.beat:LeaderScheduler", env=lease)

        def swept_and_done():
            reaper.reap()  # a second reaper, racing the one beat sends to the workers
            return Run.objects.filter(id=run.id, state__in=ENDED).first()

        run = wait_for(swept_and_done, timeout=60, interval=0.3)
    finally:
        for process in (beat, restarted):
            if process and process.proc.poll() is None:
                process.stop()

    assert run.state == "completed", run.error
    nap.refresh_from_db()
    assert nap.state == "completed" and nap.finished_at >= nap.wake_at
    assert nap.output == {"slept_until": nap.wake_at.isoformat()}
    assert Event.objects.filter(run=run, step__name="nap", kind="step.completed").count() == 1
    after = run.steps.get(name="after")
    assert after.attempts == 1 and after.output == {"slept_until": nap.output["slept_until"]}
    assert Event.objects.filter(run=run, step=after, kind="step.completed").count() == 1


def test_a_run_cancelled_while_it_sleeps_ends_and_never_wakes(workers, team):
    run = run_start(version=napper(team, nap_s=2), input={}, actor=SETUP)
    nap = wait_for(lambda: sleeping(run.id), timeout=60)

    run_cancel(run_id=run.id, actor=SETUP)

    run = wait_for_run(run.id, states=ENDED)
    assert run.state == "cancelled"
    wait_for(lambda: now() > nap.wake_at, timeout=10)
    reaper.reap()
    assert dict(run.steps.values_list("name", "state")) == {
        "before": "completed",
        "nap": "cancelled",
        "after": "cancelled",
    }
    assert not Event.objects.filter(run=run, step__name="nap", kind="step.completed").exists()
