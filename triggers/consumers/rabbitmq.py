"""Reading one trigger's RabbitMQ queue with kombu.

The queue (durable) is bound to the trigger's topic exchange (durable, declared if missing) with
its binding key. Messages are consumed without auto-ack; each is acknowledged after
`deliver` says its outcome is committed, or put back in the queue when it is not. A lost
connection is retried with a growing pause; RabbitMQ redelivers whatever was not acknowledged.
"""
from __future__ import annotations

import logging
import threading

from kombu import Connection, Exchange, Queue

from .delivery import Subscription, deliver

log = logging.getLogger("triggers.consumer")
PREFETCH = 10


class RabbitConsumer(threading.Thread):
    def __init__(self, subscription: Subscription):
        super().__init__(name=f"rabbitmq {subscription.name}", daemon=True)
        self.subscription = subscription
        self.stopping = threading.Event()

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        pause = 1.0
        while not self.stopping.is_set():
            try:
                self._consume()
                pause = 1.0
            except Exception as error:  # connection refused, reset, channel closed by the broker
                log.warning("trigger %s: RabbitMQ unavailable (%s); retrying in %.0f s",
                            self.subscription.name, error, pause)
                self.stopping.wait(pause)
                pause = min(pause * 2, 30)

    def _consume(self) -> None:
        sub = self.subscription
        exchange = Exchange(sub.exchange, type="topic", durable=True)
        queue = Queue(sub.queue, exchange, routing_key=sub.binding_key, durable=True)
        with Connection(sub.url, connect_timeout=5, heartbeat=30) as connection:
            connection.ensure_connection(max_retries=1)
            with connection.Consumer([queue], on_message=self._on_message,
                                     prefetch_count=PREFETCH, no_ack=False):
                log.info("trigger %s: consuming RabbitMQ queue %s (%s on %s)", sub.name,
                         sub.queue, sub.binding_key, sub.exchange)
                while not self.stopping.is_set():
                    try:
                        connection.drain_events(timeout=1)
                    except TimeoutError:
                        connection.heartbeat_check()

    def _on_message(self, message) -> None:
        properties = message.properties or {}
        info = message.delivery_info or {}
        meta = {"exchange": info.get("exchange", ""), "routing_key": info.get("routing_key", ""),
                "headers": _plain(message.headers or {}), "redelivered": bool(info.get("redelivered")),
                "content_type": message.content_type or ""}
        if deliver(self.subscription, message_id=properties.get("message_id"), body=message.body
                   if isinstance(message.body, bytes) else str(message.body).encode(), meta=meta):
            message.ack()
        else:
            self.stopping.wait(1)  # do not spin on a message the database cannot take yet
            message.requeue()


def _plain(headers: dict) -> dict:
    """AMQP header values as JSON data (bytes as text; anything else as its text)."""
    plain = {}
    for name, value in headers.items():
        if isinstance(value, bytes):
            value = value.decode("utf-8", errors="replace")
        plain[str(name)] = value if isinstance(value, str | int | float | bool | None) else str(value)
    return plain
