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
  (`orchestrator.events`), delivered at its commit; the relay `LISTEN`s on its own connection and
  wakes at once. It also polls every `STEPWISE_RELAY_POLL_S` (short on SQLite, where there is
  no NOTIFY; a backstop on PostgreSQL should a notification or the listening connection be lost).
* **Falling behind, restarting**: it remembers the last event id it sent and reads after it, in
  batches of `BATCH` rows; a fresh relay starts from the newest id (pages re-read on connect).
* **A burst** (10,000 events): each batch is coalesced per run into one nudge before anything is
  sent, so memory is bounded by a batch, never by the burst.
"""
import asyncio
import logging

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from django.db.models import Max

from ..events import RELAY_CHANNEL
from ..models import Event
from .groups import ALL_RUNS, run_group, team_group

log = logging.getLogger(__name__)

BATCH = 1000


def latest_event_id() -> int:
    return Event.objects.aggregate(last=Max("id"))["last"] or 0


def nudges_after(last_id: int, *, limit: int = BATCH) -> tuple[int, int, dict]:
    """The events after `last_id` (at most `limit`), coalesced per run: (rows read, newest id
    read, {run id: (team id, newest event id of that run)})."""
    rows = (Event.objects.filter(id__gt=last_id).order_by("id")
            .values_list("id", "run_id", "run__team_id")[:limit])
    runs: dict = {}
    read = 0
    for event_id, run_id, team_id in rows:
        runs[run_id] = (team_id, event_id)
        last_id = event_id
        read += 1
    return read, last_id, runs


class Relay:
    """Reads the outbox after `last_id` and sends one nudge per changed run."""

    def __init__(self, *, poll_s: float | None = None):
        self.poll_s = poll_s if poll_s is not None else settings.STEPWISE_RELAY_POLL_S
        self.last_id: int | None = None
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
        layer = get_channel_layer()
        sent = 0
        while True:
            read, self.last_id, runs = await database_sync_to_async(nudges_after)(self.last_id, limit=BATCH)
            for run_id, (team_id, event_id) in runs.items():
                message = {"type": "run.changed", "run": str(run_id), "event": event_id}
                for group in (run_group(run_id), team_group(team_id), ALL_RUNS):
                    await layer.group_send(group, message)
                sent += 1
            if read < BATCH:  # a full batch may have more behind it: read on before sleeping
                break
        self.sent += sent
        return sent

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


def ensure_started() -> Relay:
    """Start this process's relay on the running event loop, once (the first websocket)."""
    global _relay, _task
    loop = asyncio.get_running_loop()
    if _task is None or _task.done() or _task.get_loop() is not loop:
        _relay = _relay or Relay()
        _task = loop.create_task(_relay.run(), name="stepwise-outbox-relay")
    return _relay
