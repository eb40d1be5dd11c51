"""Sleep steps (docs/definitions.md, "Sleep"): a run waits `for_s` seconds or `until` a time,
holding no worker, and the reaper wakes it once its time has come — once, however many sweeps
see it and whatever sweep died half-way. Cancellation and the run's duration budget apply while
it sleeps. Runs are driven in this process through the services a worker and the reaper call,
on the engine's clock (`move_clock`).
"""

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from django.db import transaction

from orchestrator.engine.clock import now
from orchestrator.engine.selectors import runs_with_version
from orchestrator.engine.services import reaper
from orchestrator.engine.services.kinds.sleep import sleep_wake
from orchestrator.engine.services.kinds.worker import Usage, step_claim, step_succeed
from orchestrator.engine.services.runs import run_cancel, run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, Run
from orchestrator.web.progress import run_snapshot
from tests.factories import SETUP

pytestmark = pytest.mark.django_db

NOTIFY = {"name": "notify", "type": "tool", "tool": "core.echo", "after": ["nap"]}


def start(team, nap: dict, *, steps=(), run_input=None, **definition) -> Run:
    version, _ = workflow_save(
        team=team,
        definition={
            "name": "napper",
            "input_schema": {"type": "object"},
            "steps": [*steps, {"name": "nap", "type": "sleep", **nap}, NOTIFY],
            **definition,
        },
        actor=SETUP,
    )
    return run_start(version=version, input=run_input or {}, actor=SETUP)


def finish(run: Run, name: str, output: dict) -> None:
    """What a worker does with a queued step: claim it, then succeed."""
    step = run.steps.get(name=name)
    assert step.state == "queued", (name, step.state)
    claim = step_claim(step_id=step.id, worker="test")
    step_succeed(
        step_id=step.id,
        attempt=claim.attempt,
        output=output,
        usage=Usage(cost_usd=Decimal(0)),
        worker="test",
    )


def states(run: Run) -> dict[str, str]:
    return dict(run.steps.values_list("name", "state"))


def completions(run: Run) -> int:
    return Event.objects.filter(run=run, step__name="nap", kind="step.completed").count()


def test_a_sleep_waits_holding_no_worker_and_the_reaper_wakes_it_at_its_time(team, move_clock):
    run = start(team, {"for_s": 30})
    nap = run.steps.get(name="nap")

    assert states(run) == {"nap": "waiting", "notify": "blocked"}
    assert nap.queue == "" and nap.wake_at == nap.started_at + timedelta(seconds=30)
    assert Run.objects.get(id=run.id).state == "waiting"
    waiting = Event.objects.get(run=run, step=nap, kind="step.waiting")
    assert waiting.payload == {"for": "sleep", "until": nap.wake_at.isoformat()}

    move_clock(29.9)
    assert reaper.reap()["woken"] == 0
    assert states(run) == {"nap": "waiting", "notify": "blocked"}

    move_clock(30)
    assert reaper.reap()["woken"] == 1
    nap.refresh_from_db()
    assert nap.state == "completed"
    assert nap.output == {"slept_until": nap.wake_at.astimezone(UTC).isoformat()}
    assert states(run)["notify"] == "queued"
    assert Run.objects.get(id=run.id).state == "running"


def test_a_second_sweep_and_a_replayed_wake_do_nothing(team, move_clock):
    run = start(team, {"for_s": 5})
    nap = run.steps.get(name="nap")
    move_clock(6)

    assert reaper.reap()["woken"] == 1
    assert reaper.reap()["woken"] == 0
    assert sleep_wake(step_id=nap.id) is False

    assert completions(run) == 1
    assert states(run) == {"nap": "completed", "notify": "queued"}


def test_a_wake_whose_transaction_died_is_done_again_by_the_next_sweep_once(team, move_clock):
    run = start(team, {"for_s": 5})
    nap = run.steps.get(name="nap")
    move_clock(6)

    class Crash(Exception):
        pass

    with pytest.raises(Crash), transaction.atomic():  # the sweep dies before its COMMIT
        assert sleep_wake(step_id=nap.id) is True
        raise Crash
    assert states(run) == {"nap": "waiting", "notify": "blocked"}

    assert reaper.reap()["woken"] == 1
    assert completions(run) == 1
    assert states(run) == {"nap": "completed", "notify": "queued"}


def test_a_wake_before_its_time_does_nothing(team, move_clock):
    run = start(team, {"for_s": 60})
    move_clock(59)

    assert sleep_wake(step_id=run.steps.get(name="nap").id) is False
    assert states(run) == {"nap": "waiting", "notify": "blocked"}


def test_until_is_rendered_over_the_upstream_steps_and_read_in_its_time_zone(team, move_clock):
    paris = ZoneInfo("Europe/Paris")
    at = (now() + timedelta(hours=2)).astimezone(paris).replace(microsecond=0)
    pick = {"name": "pick", "type": "tool", "tool": "core.echo"}
    run = start(
        team,
        {"until": "{{ steps.pick.output.at }}", "timezone": "Europe/Paris", "after": ["pick"]},
        steps=[pick],
    )
    finish(run, "pick", {"at": at.replace(tzinfo=None).isoformat()})  # no offset: Paris time

    nap = run.steps.get(name="nap")
    assert nap.state == "waiting" and nap.wake_at == at
    move_clock(2 * 3600)
    assert reaper.reap()["woken"] == 1
    nap.refresh_from_db()
    assert nap.output == {"slept_until": at.astimezone(UTC).isoformat()}


def test_an_until_in_the_past_completes_as_it_starts(team):
    run = start(team, {"until": "{{ input.at }}"}, run_input={"at": "2001-01-01T00:00:00Z"})

    nap = run.steps.get(name="nap")
    assert nap.state == "completed"
    assert nap.output == {"slept_until": "2001-01-01T00:00:00+00:00"}
    assert states(run)["notify"] == "queued"


@pytest.mark.parametrize(
    ("at", "message"),
    [
        ("next tuesday", "until: 'next tuesday' is not a time: expected ISO 8601"),
        ("", "until: '' is not a time"),
        ("2999-01-01T00:00:00Z", "until rendered 2999-01-01T00:00:00+00:00, more than 7,776,000 s"),
    ],
)
def test_an_until_that_is_no_time_to_wait_for_fails_the_step_permanent(team, at, message):
    run = start(team, {"until": "{{ input.at }}"}, run_input={"at": at})

    nap = run.steps.get(name="nap")
    assert nap.state == "failed" and nap.error["class"] == "permanent"
    assert nap.error["message"].startswith(message), nap.error["message"]
    assert nap.wake_at is None
    assert Run.objects.get(id=run.id).state == "failed"


def test_cancelling_a_sleeping_run_cancels_the_sleep_and_its_time_wakes_nothing(team, move_clock):
    run = start(team, {"for_s": 10})

    run_cancel(run_id=run.id, actor=SETUP)

    assert Run.objects.get(id=run.id).state == "cancelled"
    assert states(run) == {"nap": "cancelled", "notify": "cancelled"}
    move_clock(11)
    assert reaper.reap()["woken"] == 0
    assert completions(run) == 0


def test_a_run_past_its_duration_while_it_sleeps_times_out(team, move_clock):
    run = start(team, {"for_s": 600}, budget={"max_duration_s": 60, "on_duration": "fail"})

    move_clock(61)
    report = reaper.reap()

    assert report["runs_timed_out"] == 1 and report["woken"] == 0
    assert Run.objects.get(id=run.id).state == "timed_out"
    assert states(run)["nap"] == "cancelled"
    move_clock(601)
    assert reaper.reap()["woken"] == 0


def test_a_run_paused_for_its_duration_keeps_sleeping_and_goes_on_once_resumed(team, move_clock):
    from orchestrator.engine.services.operators import run_budget_raise

    run = start(team, {"for_s": 120}, budget={"max_duration_s": 60})
    move_clock(61)
    assert reaper.reap()["runs_paused"] == 1
    move_clock(121)
    assert reaper.reap()["woken"] == 1  # it slept its time; the paused run starts nothing
    assert states(run) == {"nap": "completed", "notify": "blocked"}

    run_budget_raise(run_id=run.id, reason="longer nap", actor=SETUP, max_duration_s=3600)

    assert Run.objects.get(id=run.id).state == "running"
    assert states(run)["notify"] == "queued"


def test_the_run_page_says_what_the_run_sleeps_for_and_until_when(team):
    run = start(team, {"for_s": 30})
    nap = run.steps.get(name="nap")

    snapshot = run_snapshot(runs_with_version().get(id=run.id))

    assert snapshot["sleeps"] == [{"step": "nap", "until": nap.wake_at}]
    assert next(s for s in snapshot["steps"] if s["name"] == "nap")["wake_at"] == nap.wake_at


def test_the_api_shows_a_sleeping_step_s_wake_up_time(team, api):
    run = start(team, {"for_s": 30})
    nap = run.steps.get(name="nap")

    body = api.get(f"/api/v1/runs/{run.id}/").json()

    step = next(s for s in body["steps"] if s["name"] == "nap")
    assert step["state"] == "waiting"
    assert datetime.fromisoformat(step["wake_at"].replace("Z", "+00:00")) == nap.wake_at


def test_a_sweep_wakes_the_longest_overdue_first_and_the_rest_on_the_next(team, move_clock):
    naps = [
        {"name": f"nap_{i}", "type": "sleep", "for_s": 1000 - i} for i in range(reaper.BATCH + 1)
    ]
    version, _ = workflow_save(
        team=team,
        definition={
            "name": "many-naps",
            "input_schema": {"type": "object"},
            "steps": naps,
            "max_parallel": 1000,
        },
        actor=SETUP,
    )
    run = run_start(version=version, input={}, actor=SETUP)
    assert run.steps.filter(state="waiting").count() == reaper.BATCH + 1

    move_clock(1000)
    assert reaper.reap()["woken"] == reaper.BATCH
    assert list(run.steps.filter(state="waiting").values_list("name", flat=True)) == ["nap_0"]
    assert reaper.reap()["woken"] == 1
    assert Run.objects.get(id=run.id).state == "completed"
