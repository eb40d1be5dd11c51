"""The outbox relay at its edges: running on its own (polling at the interval it is given, where
it starts, a failed read retried), one process's relay started once, every group a nudge
reaches, and the bound on the ids it looks for again (tests/live/test_relay.py has the common
paths)."""
import asyncio
import logging

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer

from orchestrator.engine.services.runs import run_start
from orchestrator.models import Event
from orchestrator.web.live import relay as relay_module
from orchestrator.web.live.groups import ALL_RUNS, run_group, team_group
from orchestrator.web.live.relay import (
    GAP_WAIT_S,
    MAX_MISSING,
    Relay,
    ensure_started,
    latest_event_id,
)

from .conftest import run_async
from .test_relay import _relay_and_listen, newest, no_other_relay_in_this_process  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def polling_only():
    """The tests of a running relay's poll run where nothing else wakes it (the embedded
    default). On PostgreSQL `run` also LISTENs, and a relay cancelled while it listens leaves its
    LISTEN connection open (the process then hangs when the test database is dropped): an open
    finding of issue 40; `test_relay.py` covers NOTIFY."""
    from django.db import connection

    if connection.vendor == "postgresql":
        pytest.skip("a cancelled relay's LISTEN connection stays open on PostgreSQL (issue 40)")


async def _first_nudge(relay: Relay, group: str, start, *, before_start=None) -> dict:
    """Run `relay` until it has read where the outbox ends, call `start` (sync, in a thread),
    and return the first message `group` gets; `before_start` runs (async) in between."""
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(group, channel)
    task = asyncio.create_task(relay.run())
    try:
        while relay.last_id is None:
            await asyncio.sleep(0.01)
        if before_start:
            await before_start()
        await sync_to_async(start)()
        return await asyncio.wait_for(layer.receive(channel), timeout=10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await layer.group_discard(group, channel)


@pytest.mark.parametrize("interval_from", ["settings", "argument"])
def test_a_running_relay_reads_the_outbox_at_its_poll_interval(version, starter, settings, interval_from):
    """On SQLite nothing wakes the relay but its poll; the interval is the argument when given,
    else STEPWISE_RELAY_POLL_S (the other one is an hour here)."""
    polling_only()
    settings.STEPWISE_RELAY_POLL_S = 0.05 if interval_from == "settings" else 3600
    relay = Relay() if interval_from == "settings" else Relay(poll_s=0.05)
    team = version.workflow.team_id
    started = []

    message = run_async(_first_nudge, relay, team_group(team),
                        lambda: started.append(run_start(version=version, input={}, actor=starter)))

    assert message == {"type": "run.changed", "run": str(started[0].id), "event": newest(started[0])}
    assert relay.sent == 1


def test_a_started_relay_relays_only_what_is_committed_after_it_starts(version, starter):
    polling_only()
    earlier = run_start(version=version, input={}, actor=starter)
    relay = Relay(poll_s=0.05)
    later = []

    message = run_async(_first_nudge, relay, team_group(version.workflow.team_id),
                        lambda: later.append(run_start(version=version, input={}, actor=starter)))

    assert message["run"] == str(later[0].id) != str(earlier.id)
    assert relay.last_id == newest(later[0])


def test_a_failed_read_of_the_outbox_is_logged_and_retried_at_the_next_tick(version, starter, caplog):
    polling_only()
    relay = Relay(poll_s=0.05)
    started = []

    async def break_then_mend():
        good = relay.last_id
        relay.last_id = "not an id"  # the next read fails in the database layer
        await asyncio.sleep(0.2)  # a few ticks, each failing
        relay.last_id = good

    with caplog.at_level(logging.ERROR, logger="orchestrator.web.live.relay"):
        message = run_async(_first_nudge, relay, team_group(version.workflow.team_id),
                            lambda: started.append(run_start(version=version, input={}, actor=starter)),
                            before_start=break_then_mend)

    assert message["run"] == str(started[0].id)
    assert "outbox relay: reading the outbox failed" in [r.getMessage() for r in caplog.records]


def test_a_nudge_reaches_the_run_s_page_its_team_s_list_and_the_all_runs_list(version, starter):
    relay = Relay()
    relay.last_id = latest_event_id()
    run = run_start(version=version, input={}, actor=starter)

    sent, received = run_async(_relay_and_listen, relay,
                               [run_group(run.id), team_group(version.workflow.team_id), ALL_RUNS])

    nudge = {"type": "run.changed", "run": str(run.id), "event": newest(run)}
    assert sent == 1 and received == [nudge, nudge, nudge]
    assert relay.sent == 1


def test_an_empty_outbox_ends_at_id_0():
    assert not Event.objects.exists()
    assert latest_event_id() == 0


def test_ids_skipped_past_the_bound_are_forgotten_oldest_first_and_the_rest_found_in_batches(version, starter):
    """Two gaps of 5,000 and 7,000 ids: the relay tracks the newest MAX_MISSING (10,000) of
    them, and finds one committed late in its first batch of look-ups and one in its last."""
    run = run_start(version=version, input={}, actor=starter)
    relay = Relay()
    start = relay.last_id = latest_event_id()
    Event.objects.create(id=start + 5001, run=run, kind="test.after_a_gap")
    Event.objects.create(id=start + 12002, run=run, kind="test.after_a_wider_gap")

    sent, _ = run_async(_relay_and_listen, relay, [run_group(run.id)])

    assert sent == 1 and relay.last_id == start + 12002
    assert set(relay.missing) == set(range(start + 2001, start + 5001)) | set(range(start + 5002, start + 12002))
    assert len(relay.missing) == MAX_MISSING
    Event.objects.create(id=start + 2001, run=run, kind="test.committed_late")
    Event.objects.create(id=start + 12001, run=run, kind="test.committed_later")

    sent, received = run_async(_relay_and_listen, relay, [run_group(run.id)])

    assert [m["event"] for m in received] == [start + 2001, start + 12001]  # one per batch
    assert sent == 2 and relay.sent == 3
    assert len(relay.missing) == MAX_MISSING - 2 and start + 2001 not in relay.missing


def test_one_gap_wider_than_the_bound_is_tracked_from_its_start(version, starter):
    run = run_start(version=version, input={}, actor=starter)
    relay = Relay()
    start = relay.last_id = latest_event_id()
    Event.objects.create(id=start + MAX_MISSING + 5001, run=run, kind="test.after_a_wide_gap")

    run_async(_relay_and_listen, relay, [run_group(run.id)])

    assert set(relay.missing) == set(range(start + 1, start + MAX_MISSING + 1))


def test_a_missing_id_is_looked_for_until_the_wait_is_over(version, starter):
    run = run_start(version=version, input={}, actor=starter)
    relay = Relay()
    relay.last_id = latest_event_id()
    Event.objects.create(id=relay.last_id + 2, run=run, kind="test.after_a_gap")
    run_async(relay.relay_once)
    [missing] = relay.missing
    relay.missing[missing] -= GAP_WAIT_S - 5  # seen missing 25 s ago: looked for again
    run_async(relay.relay_once)
    assert list(relay.missing) == [missing]
    relay.missing[missing] -= 10  # 35 s ago: forgotten
    run_async(relay.relay_once)
    assert relay.missing == {}


def test_the_process_s_relay_is_started_once_and_again_after_it_stopped(settings, monkeypatch):
    # This test's relay is not left as the process's: it would start from this test's outbox.
    monkeypatch.setattr(relay_module, "_relay", None)
    monkeypatch.setattr(relay_module, "_task", None)

    async def scenario():
        def running():
            return [t for t in asyncio.all_tasks() if t.get_name() == "stepwise-outbox-relay" and not t.done()]

        settings.STEPWISE_LIVE_RELAY = False
        off = await ensure_started()
        settings.STEPWISE_LIVE_RELAY = True
        first = await ensure_started()
        again = await ensure_started()
        tasks = running()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        restarted = await ensure_started()
        after_restart = running()
        for task in after_restart:
            task.cancel()
        await asyncio.gather(*after_restart, return_exceptions=True)
        return off, first, again, len(tasks), restarted, len(after_restart)

    off, first, again, tasks, restarted, after_restart = run_async(scenario)
    assert off is None
    assert isinstance(first, Relay) and again is first and restarted is first
    assert tasks == 1 and after_restart == 1
    assert relay_module._task.done()


def test_a_relay_a_connection_starts_has_read_where_it_starts_before_the_connection_reads_on(
        settings, monkeypatch, version, starter):
    """A page re-reads what it shows after its connection's hello. Had the new relay read the
    newest event later than that, an event committed in between would never be nudged: the
    first page of a process could stay stale until the run changed again."""
    polling_only()
    monkeypatch.setattr(relay_module, "_relay", None)
    monkeypatch.setattr(relay_module, "_task", None)
    settings.STEPWISE_LIVE_RELAY = True
    team_group_name = team_group(version.workflow.team_id)

    async def scenario():
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(team_group_name, channel)
        started = await ensure_started()
        where = started.last_id
        run = await sync_to_async(run_start)(version=version, input={}, actor=starter)
        try:
            nudge = await asyncio.wait_for(layer.receive(channel), timeout=10)
        finally:
            relay_module._task.cancel()
            await asyncio.gather(relay_module._task, return_exceptions=True)
        return where, run, nudge

    where, run, nudge = run_async(scenario)
    assert where is not None and where < newest(run)
    assert nudge == {"type": "run.changed", "run": str(run.id), "event": newest(run)}
