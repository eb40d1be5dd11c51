"""The outbox relay in one process: from committed `Event` rows to one nudge per changed run,
catching up from the last id it sent, coalescing a burst."""
import asyncio
import time

import pytest
from channels.layers import get_channel_layer

from orchestrator.engine.services.runs import run_cancel, run_start
from orchestrator.models import Event
from orchestrator.web.live import relay as relay_module
from orchestrator.web.live.groups import run_group, team_group
from orchestrator.web.live.relay import Relay, nudges_after
from tests.factories import SETUP

from .conftest import run_async

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_other_relay_in_this_process(settings):
    """A websocket test earlier in this process may have started the process's own relay
    (`ensure_started`) on an event loop that still runs, and a web server a browser test
    started reads the same database: on a shared channel layer (Redis) either would nudge the
    groups these tests listen to a second time. The process's relay is stopped and kept off,
    and these tests listen on a layer of their own process."""
    settings.STEPWISE_LIVE_RELAY = False
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    task = relay_module._task
    if task is not None and not task.done() and task.get_loop().is_running():
        task.get_loop().call_soon_threadsafe(task.cancel)
        for _ in range(100):
            if task.done():
                break
            time.sleep(0.02)

TICKET: dict = {}


def newest(run) -> int:
    return Event.objects.filter(run=run).order_by("-id").values_list("id", flat=True).first()


async def _relay_and_listen(relay: Relay, groups: list[str]) -> tuple[int, list[dict]]:
    layer = get_channel_layer()
    channel = await layer.new_channel()
    for group in groups:
        await layer.group_add(group, channel)
    sent = await relay.relay_once()
    received = []
    while True:  # everything sent is in the in-memory layer already: drain it
        try:
            received.append(await asyncio.wait_for(layer.receive(channel), timeout=0.2))
        except TimeoutError:
            break
    for group in groups:
        await layer.group_discard(group, channel)
    return sent, received


def test_committed_events_become_one_nudge_per_run_to_its_page_and_its_teams_list(version, starter, team):
    relay = Relay(poll_s=0.1)
    relay.last_id = relay_module.latest_event_id()
    run = run_start(version=version, input=TICKET, actor=starter)
    sent, received = run_async(_relay_and_listen, relay, [run_group(run.id)])
    assert sent == 1  # several events of the run (created, running, the gate...) are one nudge
    assert received == [{"type": "run.changed", "run": str(run.id), "event": newest(run)}]
    _, on_list = run_async(_relay_and_listen, relay, [team_group(team.id)])
    assert on_list == []  # nothing new since: the relay moved past what it sent
    run_cancel(run_id=run.id, actor=SETUP)
    _, on_list = run_async(_relay_and_listen, relay, [team_group(team.id)])
    assert on_list == [{"type": "run.changed", "run": str(run.id), "event": newest(run)}]


def test_a_restarted_relay_starts_from_the_newest_event_and_a_late_one_catches_up(version, starter):
    first = run_start(version=version, input=TICKET, actor=starter)
    fresh = Relay()
    fresh.last_id = relay_module.latest_event_id()  # what run() does when it starts
    assert run_async(fresh.relay_once) == 0
    behind = Relay()
    behind.last_id = Event.objects.filter(run=first).order_by("id").values_list("id", flat=True)[0]
    second = run_start(version=version, input=TICKET, actor=starter)
    sent, received = run_async(_relay_and_listen, behind, [run_group(first.id), run_group(second.id)])
    assert {m["run"]: m["event"] for m in received} == {str(first.id): newest(first),
                                                       str(second.id): newest(second)}
    assert behind.last_id == newest(second)


def test_a_burst_is_read_in_bounded_batches_and_coalesced_per_run(version, starter, monkeypatch):
    monkeypatch.setattr(relay_module, "BATCH", 500)
    runs = [run_start(version=version, input=TICKET, actor=starter) for _ in range(2)]
    start = relay_module.latest_event_id()
    Event.objects.bulk_create(Event(run=runs[i % 2], kind="test.burst") for i in range(10_000))
    ids, coalesced = nudges_after(start, limit=500)
    assert len(ids) == 500 and len(coalesced) == 2  # one batch in memory, one entry per run
    relay = Relay()
    relay.last_id = start
    sent, received = run_async(_relay_and_listen, relay, [run_group(runs[0].id)])
    assert relay.last_id == relay_module.latest_event_id()  # read to the end, batch after batch
    assert sent == 2 * (10_000 // 500)  # one nudge per run per batch, not one per event
    assert received[-1]["event"] == newest(runs[0])


def test_on_postgresql_a_commit_wakes_the_relay_through_notify(version, starter):
    """With polling effectively off (an hour), only NOTIFY can bring the nudge."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; the embedded default polls")

    team_id = version.workflow.team_id

    async def scenario():
        from asgiref.sync import sync_to_async

        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(team_group(team_id), channel)
        relay = Relay(poll_s=3600)
        task = asyncio.create_task(relay.run())
        try:
            while relay.last_id is None:  # started: it knows where the outbox ends
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # and is listening
            run = await sync_to_async(run_start)(version=version, input=TICKET, actor=starter)
            message = await asyncio.wait_for(layer.receive(channel), timeout=30)
            return run, message
        finally:
            task.cancel()

    run, message = run_async(scenario)
    assert message["run"] == str(run.id)


def test_an_event_committed_after_a_newer_one_is_still_relayed(version, starter):
    """PostgreSQL hands out ids at insert, so a transaction holding a lower id can commit after
    the relay has read past it; the relay looks again for the ids it skipped."""
    run = run_start(version=version, input=TICKET, actor=starter)
    relay = Relay()
    relay.last_id = relay_module.latest_event_id()
    late_id = relay.last_id + 1
    Event.objects.create(id=late_id + 1, run=run, kind="test.committed_first")
    sent, received = run_async(_relay_and_listen, relay, [run_group(run.id)])
    assert [m["event"] for m in received] == [late_id + 1]
    assert late_id in relay.missing
    Event.objects.create(id=late_id, run=run, kind="test.committed_late")
    sent, received = run_async(_relay_and_listen, relay, [run_group(run.id)])
    assert [m["event"] for m in received] == [late_id]
    assert relay.missing == {}
    _, received = run_async(_relay_and_listen, relay, [run_group(run.id)])
    assert received == []  # relayed once


def test_an_id_that_never_commits_is_given_up_after_a_while(version, starter, monkeypatch):
    run = run_start(version=version, input=TICKET, actor=starter)
    relay = Relay()
    relay.last_id = relay_module.latest_event_id()
    Event.objects.create(id=relay.last_id + 2, run=run, kind="test.after_a_rollback")
    run_async(relay.relay_once)
    assert len(relay.missing) == 1
    monkeypatch.setattr(relay_module, "GAP_WAIT_S", -1.0)  # as if the wait were over
    run_async(relay.relay_once)
    assert relay.missing == {}
