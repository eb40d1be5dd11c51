"""Queue events on the real brokers: RabbitMQ (kombu) at 127.0.0.1:5672 and Redis streams (DB 14),
read by a real `manage.py stepwise_consume` process, with real workers running the runs.

Each test uses exchanges, queues and stream keys of its own (prefix `triggers-<random>`) and
deletes them. The fault cases SIGKILL the consumer after its run is committed and before the
message is acknowledged (STEPWISE_CONSUMER_ACK_DELAY_S holds the ack open), check that the broker
still holds the message, restart the consumer, and check that the redelivery made no second run.
"""
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis
from django.conf import settings
from kombu import Connection, Exchange, Producer, Queue

from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Run
from tests.factories import SETUP, example_definition
from triggers.models import EventDeadLetter, Firing
from triggers.services.config import trigger_create

from .conftest import ROOT, wait_for, wait_for_run, worker_env

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

RABBIT = "amqp://guest:guest@127.0.0.1:5672//"
REDIS = "redis://127.0.0.1:6379/14"
SOURCES = {"rabbitmq": RABBIT, "redis": REDIS}
TEMPLATE = {"ticket_id": "{{ payload.ticket }}", "body": "{{ payload.text }}",
            "customer_email": "{{ payload.email }}"}
TICKET = {"ticket": "T-42", "text": "My invoice is wrong", "email": "c@example.com"}


def _reachable(url: str) -> bool:
    try:
        if url.startswith("amqp"):
            with Connection(url, connect_timeout=2) as connection:
                connection.ensure_connection(max_retries=1)
        else:
            redis.Redis.from_url(url, socket_connect_timeout=2).ping()
        return True
    except Exception:
        return False


class Consumer:
    """A real `manage.py stepwise_consume` process that tests kill and restart."""

    def __init__(self, name: str):
        self.name = name
        self.log = Path(settings.VAR_DIR) / f"itest-consumer-{name}.log"
        self.log.unlink(missing_ok=True)
        self.proc: subprocess.Popen | None = None

    def start(self, *, ack_delay_s: float = 0) -> None:
        env = {**worker_env(), "STEPWISE_EVENT_SOURCES": json.dumps(SOURCES),
               "STEPWISE_CONSUMER_RELOAD_S": "0.5",
               "STEPWISE_CONSUMER_ACK_DELAY_S": str(ack_delay_s)}
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "stepwise_consume", "--name", self.name], cwd=ROOT,
            env=env, stdout=self.log.open("a"), stderr=subprocess.STDOUT, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def wait_for_log(self, needle: str, *, count: int = 1, timeout: float = 30) -> None:
        def seen():
            if self.proc.poll() is not None:
                raise AssertionError(f"consumer exited: {self.text()[-3000:]}")
            return self.text().count(needle) >= count
        wait_for(seen, timeout=timeout, interval=0.05)

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def names():
    return f"triggers-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def support(team, settings):
    settings.STEPWISE_EVENT_SOURCES = SOURCES
    workflow_save(team=team, definition=example_definition("support"), actor=SETUP)


@pytest.fixture
def consumer(names):
    process = Consumer(names)
    yield process
    process.stop()


# --- RabbitMQ -----------------------------------------------------------------------------


@pytest.fixture
def rabbit(names):
    if not _reachable(RABBIT):
        pytest.skip("RabbitMQ is not running at 127.0.0.1:5672 (.ci/run starts it)")
    exchange = Exchange(f"{names}.x", type="topic", durable=True)
    queue = Queue(f"{names}.q", exchange, routing_key="tickets.*", durable=True)
    with Connection(RABBIT) as connection:
        yield connection, exchange, queue
        channel = connection.default_channel
        queue.bind(channel).delete()
        exchange.bind(channel).delete()


def publish(connection, exchange, body: bytes, *, message_id: str, routing_key="tickets.created"):
    Producer(connection.default_channel).publish(
        body, exchange=exchange, routing_key=routing_key, message_id=message_id,
        content_type="application/json", content_encoding="utf-8", declare=[exchange])


def ready_in(connection, queue) -> int:
    """Messages waiting in the queue (not counting any a live consumer holds)."""
    return queue.bind(connection.default_channel).queue_declare(passive=True).message_count


def test_a_rabbitmq_message_is_acked_only_after_its_run_commits_and_a_kill_between_makes_no_second_run(
        workers, team, support, rabbit, consumer, names):
    connection, exchange, queue = rabbit
    trigger, _ = trigger_create(team=team, kind="queue", name="tickets", workflow="support-reply",
                                actor=SETUP, source="rabbitmq", exchange=exchange.name,
                                binding_key="tickets.*", queue=queue.name, input_template=TEMPLATE)
    consumer.start(ack_delay_s=30)
    consumer.wait_for_log(f"consuming RabbitMQ queue {queue.name}")
    publish(connection, exchange, json.dumps(TICKET).encode(), message_id="m-1")

    run = wait_for(lambda: Run.objects.filter(trigger_firing__trigger=trigger).first())
    consumer.wait_for_log("acknowledging in")  # committed, the ack held open
    consumer.kill()                            # SIGKILL between the commit and the ack
    wait_for(lambda: ready_in(connection, queue) == 1)  # the broker still holds the message

    consumer.start()
    consumer.wait_for_log("message m-1 duplicate")
    wait_for(lambda: ready_in(connection, queue) == 0)
    assert Run.objects.filter(trigger_firing__trigger=trigger).count() == 1
    assert Firing.objects.get(trigger=trigger).key == "message:m-1"
    assert wait_for_run(run.id, states=("waiting", "failed")).state == "waiting"  # at its gate


def test_a_malformed_rabbitmq_message_lands_in_the_dead_letters_and_is_acked(
        workers, team, support, rabbit, consumer):
    connection, exchange, queue = rabbit
    trigger, _ = trigger_create(team=team, kind="queue", name="tickets", workflow="support-reply",
                                actor=SETUP, source="rabbitmq", exchange=exchange.name,
                                binding_key="tickets.*", queue=queue.name, input_template=TEMPLATE)
    consumer.start()
    consumer.wait_for_log(f"consuming RabbitMQ queue {queue.name}")
    publish(connection, exchange, b"{this is not json", message_id="bad-1")
    publish(connection, exchange, json.dumps({"ticket": "T-1"}).encode(), message_id="bad-2")
    publish(connection, exchange, json.dumps(TICKET).encode(), message_id="ok-1",
            routing_key="tickets.updated")

    wait_for(lambda: Firing.objects.filter(trigger=trigger).exists())
    wait_for(lambda: EventDeadLetter.objects.filter(trigger=trigger).count() == 2)
    letters = {d.key: d for d in EventDeadLetter.objects.filter(trigger=trigger)}
    assert letters["message:bad-1"].reason_class == "malformed"
    assert letters["message:bad-2"].reason_class == "template_failed"
    assert letters["message:bad-2"].meta["routing_key"] == "tickets.created"
    wait_for(lambda: ready_in(connection, queue) == 0)
    assert Run.objects.filter(trigger_firing__trigger=trigger).count() == 1


# --- Redis streams --------------------------------------------------------------------------


@pytest.fixture
def stream(names):
    if not _reachable(REDIS):
        pytest.skip("Redis is not running at 127.0.0.1:6379")
    client = redis.Redis.from_url(REDIS)
    key = f"{names}:tickets"
    yield client, key
    client.delete(key)


def test_a_redis_stream_event_is_acked_only_after_its_run_commits_and_a_kill_between_makes_no_second_run(
        workers, team, support, stream, consumer):
    client, key = stream
    trigger, _ = trigger_create(team=team, kind="queue", name="stream", workflow="support-reply",
                                actor=SETUP, source="redis", stream=key, input_template=TEMPLATE,
                                filter="message.fields.type == 'ticket'")
    consumer.start(ack_delay_s=30)
    consumer.wait_for_log(f"consuming Redis stream {key}")
    client.xadd(key, {"type": "other", "payload": json.dumps(TICKET)})  # filtered out
    entry = client.xadd(key, {"type": "ticket", "payload": json.dumps(TICKET)}).decode()

    run = wait_for(lambda: Run.objects.filter(trigger_firing__trigger=trigger).first())
    consumer.wait_for_log(f"message {entry} committed; acknowledging in")
    consumer.kill()
    group = trigger.stream_group
    assert client.xpending(key, group)["pending"] == 1  # committed, never acknowledged

    consumer.start()
    consumer.wait_for_log(f"message {entry} duplicate")
    wait_for(lambda: client.xpending(key, group)["pending"] == 0)
    assert Run.objects.filter(trigger_firing__trigger=trigger).count() == 1
    assert run.trigger_firing.key == f"message:{entry}"
    assert wait_for_run(run.id, states=("waiting", "failed")).state == "waiting"


def test_a_malformed_redis_stream_event_lands_in_the_dead_letters_with_its_reason(
        workers, team, support, stream, consumer):
    client, key = stream
    trigger, _ = trigger_create(team=team, kind="queue", name="stream", workflow="support-reply",
                                actor=SETUP, source="redis", stream=key, input_template=TEMPLATE)
    consumer.start()
    consumer.wait_for_log(f"consuming Redis stream {key}")
    bad = client.xadd(key, {"payload": "[1, 2"}).decode()
    flat = client.xadd(key, {"ticket": "T-9", "text": "Hello", "email": "c@example.com"}).decode()

    letter = wait_for(lambda: EventDeadLetter.objects.filter(trigger=trigger).first())
    assert (letter.key, letter.reason_class) == (f"message:{bad}", "malformed")
    run = wait_for(lambda: Run.objects.filter(trigger_firing__trigger=trigger).first())
    assert run.trigger_firing.key == f"message:{flat}"  # fields without `payload` are the payload
    assert run.input["ticket_id"] == "T-9"
    wait_for(lambda: client.xpending(key, trigger.stream_group)["pending"] == 0)
