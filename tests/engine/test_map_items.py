"""Map items have the life of small steps: retried under their policy, claimed under a lease,
timed out, and recovered by the reaper — without a storm of re-sent messages.

These call the services a worker and the reaper call; a local HTTP sink stands in for the
remote each item calls.
"""
from datetime import timedelta

import pytest

from orchestrator.engine.clock import now
from orchestrator.engine.services.kinds import map_step
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, MapItem
from tests.factories import SETUP
from tests.support.http_sink import HttpSink


@pytest.fixture
def sink():
    with HttpSink() as sink:
        yield sink


def fan_out(team, sink, *, items=1, retry=None, timeout_s=300, max_parallel=10):
    retry = retry or {"max_attempts": 3, "base_s": 0.1, "max_s": 0.1, "jitter": False}
    version, _ = workflow_save(team=team, definition={
        "name": "fan", "input_schema": {"type": "object"}, "max_parallel": max_parallel,
        "steps": [{"name": "each", "type": "map", "over": "input.items", "item": {
            "type": "tool", "tool": "http.request", "retry": retry, "timeout_s": timeout_s,
            "params": {"method": "POST", "url": f"{sink.url}/item", "json": {"n": "{{ item }}"}}}}]}, actor=SETUP)
    run = run_start(version=version, input={"items": list(range(items))}, actor=SETUP)
    return run.steps.get(name="each")


def item_of(step, index=0) -> MapItem:
    return MapItem.objects.get(step=step, index=index)


def test_an_item_that_fails_transiently_is_retried_under_its_policy(team, sink, move_clock):
    step = fan_out(team, sink)
    sink.fail_next(1, 503)
    outcome = map_step.map_item_run(step_id=step.id, index=0)
    assert outcome.verdict == map_step.RETRY and outcome.delay_s == pytest.approx(0.1, abs=0.05)
    item = item_of(step)
    assert (item.done, item.attempts, item.lease_expires_at, item.error["class"]) == (False, 1, None, "transient")
    assert Event.objects.filter(step=step, kind="step.item_retrying").count() == 1
    move_clock(0.15)
    assert map_step.map_item_run(step_id=step.id, index=0).verdict == map_step.DONE
    item = item_of(step)
    assert (item.done, item.attempts, item.error, item.output["status"]) == (True, 2, None, 200)


def test_an_item_is_not_taken_again_before_it_is_due(team, sink):
    step = fan_out(team, sink, retry={"max_attempts": 3, "base_s": 5, "max_s": 5, "jitter": False})
    sink.fail_next(1, 503)
    assert map_step.map_item_run(step_id=step.id, index=0).verdict == map_step.RETRY
    assert map_step.map_item_run(step_id=step.id, index=0).verdict == map_step.SKIPPED
    assert len(sink.requests) == 1


@pytest.mark.parametrize("status, error_class", [(422, "permanent"), (503, "transient")])
def test_an_error_the_policy_does_not_retry_finishes_the_item_with_it(team, sink, status, error_class):
    step = fan_out(team, sink, retry={"max_attempts": 1})
    sink.fail_next(1, status)
    assert map_step.map_item_run(step_id=step.id, index=0).verdict == map_step.DONE
    item = item_of(step)
    assert (item.done, item.attempts, item.error["class"]) == (True, 1, error_class)


def claim(step, index=0, timeout_s=300) -> int:
    """Take the item as a worker would, then let that worker die (nothing renews the lease)."""
    item = item_of(step, index)
    run = step.run
    verdict, attempt = map_step._take_slot(item, run, cap=10, timeout_s=timeout_s)
    assert verdict == map_step.DONE
    return attempt


def test_the_reaper_retries_an_item_whose_worker_died_and_a_late_finisher_changes_nothing(
        team, sink, settings, django_capture_on_commit_callbacks, move_clock):
    settings.STEPWISE_LEASE_S = 0.05
    step = fan_out(team, sink)
    attempt = claim(step)
    assert map_step.map_item_run(step_id=step.id, index=0).verdict == map_step.SKIPPED  # leased
    move_clock(0.1)
    assert map_step.map_item_run(step_id=step.id, index=0).verdict == map_step.SKIPPED  # only the reaper
    with django_capture_on_commit_callbacks() as sent:
        assert map_step.map_items_recover(step_id=step.id, stale_before=now() - timedelta(minutes=1)) == 1
    # One re-send (the other callback writes the retry's log line, orchestrator.engine.events).
    assert len([c for c in sent if "map_items_redispatch" in c.__qualname__]) == 1
    item = item_of(step)
    assert (item.lease_expires_at, item.error["class"], item.attempts) == (None, "lost", 1)
    map_step._finish(item, attempt, output={"late": True}, error=None, spent=None)
    assert item_of(step).done is False


def test_an_item_lost_three_times_is_finished_as_lost_and_fails_the_map(team, sink, settings, move_clock):
    settings.STEPWISE_LEASE_S = 0.01
    step = fan_out(team, sink, retry={"max_attempts": 1})
    for attempt in range(3):
        MapItem.objects.filter(id=item_of(step).id).update(due_at=now())
        claim(step)
        move_clock(0.03 * (attempt + 1))
        map_step.map_items_recover(step_id=step.id, stale_before=now() - timedelta(minutes=1))
    item = item_of(step)
    assert (item.done, item.attempts, item.error["class"]) == (True, 3, "lost")
    assert map_step.map_join(step_id=step.id)
    step.refresh_from_db()
    assert step.state == "failed" and step.error["class"] == "map_failed"


def test_the_reaper_times_out_an_item_that_overruns_and_its_policy_retries_it(team, sink, move_clock):
    step = fan_out(team, sink, timeout_s=1, retry={"max_attempts": 2, "base_s": 0, "max_s": 0, "jitter": False})
    claim(step, timeout_s=1)  # the lease is fresh (30 s), but the attempt may only take 1 s
    move_clock(1.1)
    map_step.map_items_recover(step_id=step.id, stale_before=now() - timedelta(minutes=1))
    item = item_of(step)
    assert (item.done, item.lease_expires_at, item.error["class"]) == (False, None, "timeout")
    assert map_step.map_item_run(step_id=step.id, index=0).verdict == map_step.DONE
    assert item_of(step).attempts == 2


def test_the_reaper_resends_a_lost_message_once_and_only_when_the_run_has_room(
        team, sink, django_capture_on_commit_callbacks):
    step = fan_out(team, sink, items=3, max_parallel=1)
    later = now() + timedelta(seconds=1)  # every message is "stale": sent before this
    claim(step, index=0)  # the run's one slot is taken: the others may be waiting their turn
    with django_capture_on_commit_callbacks() as sent:
        assert map_step.map_items_recover(step_id=step.id, stale_before=later) == 0
    assert sent == []
    MapItem.objects.filter(step=step, index=0).update(done=True, lease_expires_at=None)
    with django_capture_on_commit_callbacks() as sent:
        assert map_step.map_items_recover(step_id=step.id, stale_before=later) == 2
        assert map_step.map_items_recover(step_id=step.id, stale_before=now() - timedelta(minutes=1)) == 0
    assert len(sent) == 1  # one re-send of both, not one per sweep


def test_a_retry_too_long_for_the_broker_waits_in_the_database_and_the_reaper_sends_it_when_due(
        team, sink, django_capture_on_commit_callbacks):
    step = fan_out(team, sink, retry={"max_attempts": 2, "base_s": 45, "max_s": 45, "jitter": False})
    sink.fail_next(1, 503)
    assert map_step.map_item_run(step_id=step.id, index=0).verdict == map_step.SKIPPED  # not in the broker
    stale = now() - timedelta(minutes=1)
    assert map_step.map_items_recover(step_id=step.id, stale_before=stale) == 0  # not due yet
    MapItem.objects.filter(step=step).update(due_at=now())  # 45 s later
    with django_capture_on_commit_callbacks() as sent:
        assert map_step.map_items_recover(step_id=step.id, stale_before=stale) == 1
    assert len(sent) == 1
    assert map_step.map_item_run(step_id=step.id, index=0).verdict == map_step.DONE
