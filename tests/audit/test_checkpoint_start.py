"""A checkpoint at start: a worker that consumes the `audit` queue, and beat, each send the
checkpoint task with `at_start` when they start; a worker of other queues sends nothing.
(tests/audit/test_audit_worker.py starts a real audit worker.)"""
from types import SimpleNamespace

from audit.tasks import checkpoint_when_an_audit_worker_starts, checkpoint_when_beat_starts


class App:
    def __init__(self):
        self.sent = []

    def send_task(self, name, args=None, kwargs=None, **options):
        self.sent.append((name, kwargs, options.get("queue")))


def worker(*queues: str) -> SimpleNamespace:
    return SimpleNamespace(app=App(), task_consumer=SimpleNamespace(
        queues=[SimpleNamespace(name=name) for name in queues]))


def test_a_worker_consuming_the_audit_queue_asks_for_a_checkpoint_when_it_is_ready():
    audit = worker("orchestrator", "audit")
    checkpoint_when_an_audit_worker_starts(sender=audit)
    assert audit.app.sent == [("audit.tasks.checkpoint", {"at_start": True}, "audit")]

    tools = worker("tools", "tools.batch")
    checkpoint_when_an_audit_worker_starts(sender=tools)
    assert tools.app.sent == []


def test_beat_asks_for_a_checkpoint_when_it_starts():
    beat = SimpleNamespace(app=App())
    checkpoint_when_beat_starts(sender=beat)
    assert beat.app.sent == [("audit.tasks.checkpoint", {"at_start": True}, "audit")]
