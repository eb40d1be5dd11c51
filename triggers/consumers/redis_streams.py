"""Reading one trigger's Redis stream through a consumer group of its own.

The group (`stepwise.<trigger id>`) is created at the stream's end if missing, so a new trigger
reads the events published from then on. The thread first re-reads the entries it had been
given and not acknowledged (after a restart under the same consumer name), claims entries
another consumer left unacknowledged for STEPWISE_CONSUMER_CLAIM_IDLE_S (a consumer that died),
then blocks for new ones. An entry is acknowledged (XACK) after `deliver` says its outcome is
committed.

An entry's body is its `payload` field (JSON text) when it has one; otherwise its fields, as a
JSON object of strings, are the payload. The entry id is the message id.
"""
from __future__ import annotations

import json
import logging
import threading
import time

import redis
from django.conf import settings

from .delivery import Subscription, deliver

log = logging.getLogger("triggers.consumer")
BATCH = 10
CLAIM_EVERY_S = 10


class StreamConsumer(threading.Thread):
    def __init__(self, subscription: Subscription, consumer_name: str):
        super().__init__(name=f"redis {subscription.name}", daemon=True)
        self.subscription = subscription
        self.consumer_name = consumer_name
        self.stopping = threading.Event()

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        pause = 1.0
        while not self.stopping.is_set():
            try:
                self._consume()
                pause = 1.0
            except (redis.exceptions.RedisError, OSError) as error:
                log.warning("trigger %s: Redis unavailable (%s); retrying in %.0f s",
                            self.subscription.name, error, pause)
                self.stopping.wait(pause)
                pause = min(pause * 2, 30)

    def _consume(self) -> None:
        sub = self.subscription
        client = redis.Redis.from_url(sub.url, socket_connect_timeout=5, socket_timeout=10)
        try:
            client.xgroup_create(sub.stream, sub.group, id="$", mkstream=True)
        except redis.exceptions.ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise
        log.info("trigger %s: consuming Redis stream %s (group %s, consumer %s)", sub.name,
                 sub.stream, sub.group, self.consumer_name)
        while not self.stopping.is_set() and self._read(client, "0"):
            pass  # what this consumer was given before it stopped, until none is left
        claimed_at = 0.0
        while not self.stopping.is_set():
            if time.monotonic() - claimed_at > CLAIM_EVERY_S:
                self._claim(client)
                claimed_at = time.monotonic()
            self._read(client, ">", block_ms=1000)

    def _read(self, client: redis.Redis, start: str, block_ms: int | None = None) -> bool:
        """Handle one batch; True when there may be more of it to read."""
        answer = client.xreadgroup(self.subscription.group, self.consumer_name,
                                   {self.subscription.stream: start}, count=BATCH, block=block_ms)
        entries = [entry for _stream, batch in (answer or []) for entry in batch]
        return bool(entries) and self._handle(client, entries)

    def _claim(self, client: redis.Redis) -> None:
        idle_ms = int(settings.STEPWISE_CONSUMER_CLAIM_IDLE_S * 1000)
        answer = client.xautoclaim(self.subscription.stream, self.subscription.group,
                                   self.consumer_name, min_idle_time=idle_ms, start_id="0-0",
                                   count=BATCH)
        if answer and answer[1]:
            self._handle(client, answer[1])

    def _handle(self, client: redis.Redis, entries: list) -> bool:
        """Deliver entries in order; False (stop reading this batch) at the first not taken."""
        sub = self.subscription
        for entry_id, fields in entries:
            message_id = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
            if fields is None:  # trimmed from the stream while pending: nothing to deliver
                client.xack(sub.stream, sub.group, entry_id)
                continue
            body, meta = _body_and_meta(sub.stream, fields)
            if not deliver(sub, message_id=message_id, body=body, meta=meta):
                self.stopping.wait(1)
                return False
            client.xack(sub.stream, sub.group, entry_id)
        return True


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _body_and_meta(stream: str, fields: dict) -> tuple[bytes, dict]:
    raw = {_text(name): value for name, value in fields.items()}
    others = {name: _text(value) for name, value in raw.items() if name != "payload"}
    if "payload" in raw:
        payload = raw["payload"]
        body = payload if isinstance(payload, bytes) else str(payload).encode()
    else:
        body = json.dumps(others).encode()
    return body, {"stream": stream, "fields": others}



