"""Keeping one consumer thread per enabled queue trigger, and following changes.

Every STEPWISE_CONSUMER_RELOAD_S the supervisor re-reads the enabled queue triggers: a new or
re-enabled trigger gets a thread, a disabled or deleted one loses it, a changed one (source,
exchange, binding, queue or stream) is restarted, and a thread that died is started again. So a
change in the admin needs no restart of the process.
"""
from __future__ import annotations

import logging
import threading

from django.conf import settings
from django.db import close_old_connections

from ..selectors import queue_triggers
from .delivery import Subscription
from .rabbitmq import RabbitConsumer
from .redis_streams import StreamConsumer

log = logging.getLogger("triggers.consumer")


class Supervisor:
    def __init__(self, *, consumer_name: str, sources: set[str] | None = None):
        self.consumer_name = consumer_name
        self.sources = sources
        self.running: dict[str, tuple[Subscription, threading.Thread]] = {}

    def wanted(self) -> dict[str, Subscription]:
        found = {}
        for trigger in queue_triggers():
            if self.sources and trigger.source not in self.sources:
                continue
            subscription = Subscription.of(trigger)
            if subscription is None:
                log.warning("trigger %s/%s: source '%s' is not in STEPWISE_EVENT_SOURCES",
                            trigger.team.slug, trigger.name, trigger.source)
                continue
            found[subscription.trigger_id] = subscription
        return found

    def reconcile(self) -> None:
        close_old_connections()
        try:
            wanted = self.wanted()
        except Exception:  # the database is restarting: keep what runs, look again later
            log.exception("consumer: cannot read the triggers; keeping the current threads")
            close_old_connections()
            return
        for trigger_id, (subscription, thread) in list(self.running.items()):
            if wanted.get(trigger_id) != subscription or not thread.is_alive():
                thread.stop()
                thread.join(timeout=15)
                del self.running[trigger_id]
        for trigger_id, subscription in wanted.items():
            if trigger_id not in self.running:
                thread = (RabbitConsumer(subscription) if subscription.is_rabbitmq
                          else StreamConsumer(subscription, self.consumer_name))
                thread.start()
                self.running[trigger_id] = (subscription, thread)

    def run(self, stopping: threading.Event) -> None:
        log.info("consumer %s: started", self.consumer_name)
        while not stopping.is_set():
            self.reconcile()
            stopping.wait(settings.STEPWISE_CONSUMER_RELOAD_S)
        for _subscription, thread in self.running.values():
            thread.stop()
        for _subscription, thread in self.running.values():
            thread.join(timeout=15)
        log.info("consumer %s: stopped", self.consumer_name)
