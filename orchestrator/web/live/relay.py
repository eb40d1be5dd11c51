"""The outbox relay: new `Event` rows become nudges to the websocket groups, after commit.

One relay runs inside each ASGI process, started by the first websocket that connects. It reads
the outbox from the database, so a change committed by a worker in another process reaches the
pages served here whatever the channel layer is (the in-memory layer of the embedded default
does not cross processes; the database does).

* **What it sends**: for each run with new events, one message to the run's group and one to its
  team's run-list group, carrying the id of the newest event. Events are nudges, not the truth:
  a page re-reads the state when nudged and when it (re)connects, so a lost nudge never leaves
  it stale.
* **When**: PostgreSQL sends `NOTIFY stepwise_events` in the transaction that writes an event
  (`orchestrator.engine.events`), delivered at its commit; the relay `LISTEN`s on its own connection
  and wakes at once. It also polls every `STEPWISE_RELAY_POLL_S` (short on SQLite, where there is
  no NOTIFY; a backstop on PostgreSQL should a notification or the listening connection be lost).
* **Falling behind, restarting**: it remembers the last event id it sent and reads after it, in
  batches of `BATCH` rows; a fresh relay starts from the newest id (pages re-read on connect).
  Ids it skipped (a transaction that took a lower id and commits later) are looked for again
  for `GAP_WAIT_S`.
* **A burst** (10,000 events): each batch is coalesced per run into one nudge before anything is
  sent, so memory is bounded by a batch, never by the burst.
"""
import asyncio
import logging
import time

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from django.db.models import Max

from orchestrator.engine.events import RELAY_CHANNEL
from orchestrator.models import Event

from .groups import ALL_RUNS, run_group, team_group

log = logging.getLogger(__name__)

BATCH = 1000
# An id below the newest one read that is not there yet: its transaction took the id and has
# not committed (PostgreSQL hands out ids at insert, so commits land out of order), or rolled
# back (then it never comes). The relay looks for such ids for this long, and tracks at most
# MAX_MISSING of them, oldest forgotten first.
GAP_WAIT_S = 30.0
MAX_MISSING = 10_000


def latest_event_id() -> int:
    return Event.objects.aggregate(last=Max("id"))["last"] or 0


def _coalesce(rows) -> tuple[list[int], dict]:
    """(the ids read, {run id: (team id, newest event id of that run)})."""
    ids, runs = [], {}
    for event_id, run_id, team_id in rows:
        ids.append(event_id)
        runs[run_id] = (team_id, max(runs.get(run_id, (team_id, 0))[1], event_id))
    return ids, runs


def nudges_after(last_id: int, *, limit: int = BATCH) -> tuple[list[int], dict]:
    """The events after `last_id` (at most `limit`, in id order), coalesced per run: (the ids
    read, {run id: (team id, newest event id of that run)})."""
    return _coalesce(Event.objects.filter(id__gt=last_id).order_by("id")
                     .values_list("id", "run_id", "run__team_id")[:limit])


def nudges_among(ids: list[int]) -> tuple[list[int], dict]:
    """Those of `ids` that are committed now, and their nudges (coalesced per run)."""
    return _coalesce(Event.objects.filter(id__in=ids).order_by("id")
                     .values_list("id", "run_id", "run__team_id"))


class Relay:
    """Reads the outbox after `last_id` and sends one nudge per changed run."""

    def __init__(self, *, poll_s: float | None = None):
        self.poll_s = poll_s if poll_s is not None else settings.STEPWISE_RELAY_POLL_S
        self.last_id: int | None = None
        self.missing: dict[int, float] = {}  # id -> when the relay first saw it missing
        self.wake = asyncio.Event()
        self.sent = 0  # nudges sent, for the benchmark and the tests

    async def run(self) -> None:
        self.wake = asyncio.Event()  # bound to the loop it runs on
        if self.last_id is None:
            self.last_id = await database_sync_to_async(latest_event_id)()
        listener = None
        if connection.vendor == "postgresql":
            listener = asyncio.create_task(self._listen())
        try:
            while True:
                try:
                    await self.relay_once()
                except Exception:  # a database hiccup must not end the relay: retry next tick
                    log.exception("outbox relay: reading the outbox failed")
                try:
                    await asyncio.wait_for(self.wake.wait(), timeout=self.poll_s)
                except TimeoutError:
                    pass
                self.wake.clear()
        finally:
            if listener:
                listener.cancel()

    async def relay_once(self) -> int:
        """Send the nudges for everything committed since the last call; return how many."""
        sent = await self._fill_gaps()
        while True:
            ids, runs = await database_sync_to_async(nudges_after)(self.last_id, limit=BATCH)
            if ids:
                self._note_gaps(self.last_id, ids)
                self.last_id = ids[-1]
            sent += await self._send(runs)
            if len(ids) < BATCH:  # a full batch may have more behind it: read on before sleeping
                break
        self.sent += sent
        return sent

    def _note_gaps(self, before: int, ids: list[int]) -> None:
        """Remember the ids skipped between `before` and the sorted `ids` just read."""
        if ids[-1] - before == len(ids):
            return  # no gap: the common case
        at, expected = time.monotonic(), before + 1
        for event_id in ids:
            for absent in range(expected, min(event_id, expected + MAX_MISSING)):
                self.missing.setdefault(absent, at)
            expected = event_id + 1
        while len(self.missing) > MAX_MISSING:
            self.missing.pop(next(iter(self.missing)))

    async def _fill_gaps(self) -> int:
        if not self.missing:
            return 0
        expired = time.monotonic() - GAP_WAIT_S
        for event_id in [i for i, at in self.missing.items() if at < expired]:
            del self.missing[event_id]
        sent = 0
        ids = list(self.missing)
        for start in range(0, len(ids), BATCH):
            found, runs = await database_sync_to_async(nudges_among)(ids[start:start + BATCH])
            for event_id in found:
                self.missing.pop(event_id, None)
            sent += await self._send(runs)
        return sent

    async def _send(self, runs: dict) -> int:
        layer = get_channel_layer()
        for run_id, (team_id, event_id) in runs.items():
            message = {"type": "run.changed", "run": str(run_id), "event": event_id}
            for group in (run_group(run_id), team_group(team_id), ALL_RUNS):
                await layer.group_send(group, message)
        return len(runs)

    async def _listen(self) -> None:
        """Wake the relay on each NOTIFY (PostgreSQL); reconnect when the connection drops."""
        import psycopg  # only on PostgreSQL deployments, where psycopg is installed

        while True:
            try:
                params = connection.get_connection_params()
                params.pop("cursor_factory", None)
                params.pop("context", None)
                params.pop("prepare_threshold", None)
                async with await psycopg.AsyncConnection.connect(autocommit=True, **params) as conn:
                    await conn.execute(f"LISTEN {RELAY_CHANNEL}")
                    self.wake.set()  # anything committed while we were not listening
                    async for _ in conn.notifies():
                        self.wake.set()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("outbox relay: the LISTEN connection failed; reconnecting")
                await asyncio.sleep(1)


_relay: Relay | None = None
_task: asyncio.Task | None = None


def _stopped(loop) -> bool:
    return _task is None or _task.done() or _task.get_loop() is not loop


async def ensure_started() -> Relay | None:
    """Start this process's relay on the running event loop, once (the first websocket); None
    when the relay is off (`STEPWISE_LIVE_RELAY`).

    A new relay has read where it starts before this returns: a connection reads the state it
    shows after that, so an event committed in between is nudged rather than lost."""
    global _relay, _task
    if not settings.STEPWISE_LIVE_RELAY:
        return None
    loop = asyncio.get_running_loop()
    if _stopped(loop):
        _relay = _relay or Relay()
        if _relay.last_id is None:
            newest = await database_sync_to_async(latest_event_id)()
            if _relay.last_id is None:  # another connection may have read it meanwhile
                _relay.last_id = newest
        if _stopped(loop):
            _task = loop.create_task(_relay.run(), name="stepwise-outbox-relay")
    return _relay
