"""What every consumer thread does with one message: hand it to the service, then say whether
to acknowledge it. The only place that decides ack or not."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from django.conf import settings
from django.db import close_old_connections

from ..models import Trigger
from ..selectors import source_url
from ..services.events import event_receive

log = logging.getLogger("triggers.consumer")


@dataclass(frozen=True)
class Subscription:
    """What a consumer thread reads for one trigger; a change restarts the thread."""

    trigger_id: str
    name: str
    url: str
    exchange: str
    binding_key: str
    queue: str
    stream: str
    group: str

    @property
    def is_rabbitmq(self) -> bool:
        return self.url.startswith(("amqp://", "amqps://", "pyamqp://"))

    @classmethod
    def of(cls, trigger: Trigger) -> Subscription | None:
        url = source_url(trigger.source)
        if url is None:
            return None
        return cls(str(trigger.id), f"{trigger.team.slug}/{trigger.name}", url, trigger.exchange,
                   trigger.binding_key, trigger.queue_name, trigger.stream, trigger.stream_group)


def deliver(subscription: Subscription, *, message_id: str | None, body: bytes, meta: dict) -> bool:
    """Process one message; True when it may be acknowledged (its outcome is committed)."""
    close_old_connections()  # a long-lived thread: drop a connection the database closed
    try:
        outcome = event_receive(trigger_id=subscription.trigger_id, message_id=message_id,
                                body=body, meta=meta)
    except Exception:  # the database is down, say: keep the message, it comes back
        log.exception("trigger %s: message %s not processed; it stays in the queue",
                      subscription.name, message_id)
        close_old_connections()
        return False
    if outcome.status in ("disabled", "not_found"):
        return False  # the thread stops at the next reload; the message waits for the trigger
    run = f" run {outcome.run.id}" if outcome.run else ""
    log.info("trigger %s: message %s %s%s%s", subscription.name, message_id, outcome.status, run,
             f" ({outcome.reason})" if outcome.reason else "")
    delay = settings.STEPWISE_CONSUMER_ACK_DELAY_S
    if delay and outcome.status in ("started", "signalled", "queued", "debounced"):
        # Fault tests kill the process in this window: committed, not yet acknowledged.
        log.info("trigger %s: message %s committed; acknowledging in %s s", subscription.name,
                 message_id, delay)
        time.sleep(delay)
    return True
