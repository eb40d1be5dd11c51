"""`manage.py stepwise_consume`: the queue-event consumer process (Procfile `events`, compose
`consumer`). One is enough; more (on other hosts, with other --name values) share the work
safely: every message is processed once per trigger whoever gets it (docs/triggers.md)."""
import logging
import signal
import socket
import threading

from django.core.management.base import BaseCommand

from triggers.consumers.supervisor import Supervisor


class Command(BaseCommand):
    help = "Consume the RabbitMQ queues and Redis streams of the enabled queue-event triggers."

    def add_arguments(self, parser):
        parser.add_argument("--name", default=socket.gethostname(),
                            help="This consumer's name in Redis consumer groups (stable across "
                                 "restarts, so it takes back what it had not acknowledged).")
        parser.add_argument("--source", action="append", default=None,
                            help="Only these sources of STEPWISE_EVENT_SOURCES (repeatable).")

    def handle(self, *args, name: str, source: list[str] | None, **options):
        logging.getLogger("triggers.consumer").setLevel(logging.INFO)
        stopping = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stopping.set())
        Supervisor(consumer_name=name, sources=set(source) if source else None).run(stopping)
