"""The broker transports' fixes: the embedded one never hands a consumer a half-written
message; Redis's lets a worker answer messages of a connection it lost."""
import logging
import threading

import kombu
import pytest
import redis

import orchestrator.operations.broker  # noqa: F401  (registers stepwisefs://)
from tests.support.integrations import REDIS_URL, need, unique


def test_messages_written_while_being_consumed_arrive_whole(tmp_path):
    options = {"data_folder_in": str(tmp_path), "data_folder_out": str(tmp_path),
               "control_folder": str(tmp_path / "control"), "polling_interval": 0.001}
    (tmp_path / "control").mkdir()
    queue = kombu.Queue("q", routing_key="q")
    sent = 300
    payload = {"body": "x" * 50_000}  # large enough that a write is not instantaneous

    def produce():
        with kombu.Connection("stepwisefs://", transport_options=options) as conn:
            producer = conn.Producer()
            for i in range(sent):
                producer.publish({**payload, "i": i}, routing_key="q", declare=[queue])

    received = []
    with kombu.Connection("stepwisefs://", transport_options=options) as conn:
        thread = threading.Thread(target=produce)
        thread.start()
        simple = conn.SimpleQueue(queue)
        while len(received) < sent:
            message = simple.get(timeout=10)
            received.append(message.payload["i"])
            message.ack()
        thread.join()
    assert sorted(received) == list(range(sent))
    assert not list((tmp_path / ".staging").iterdir())


@pytest.fixture
def redis_prefix():
    """A key prefix of the test's own on the shared Redis, its keys deleted after."""
    need("Redis")
    prefix = unique() + ":"
    yield prefix
    server = redis.Redis.from_url(REDIS_URL)
    for key in server.scan_iter(f"{prefix}*"):
        server.delete(key)


@pytest.mark.parametrize("answer", ["ack", "reject"])
def test_a_message_answered_after_its_connection_was_let_go_does_not_raise(answer, redis_prefix, caplog):
    """Celery's consumer lets go of a lost connection's transport before it closes every channel
    of it; a task that ends later answers its message on such a channel from the new
    connection's loop. An error there would stop the whole worker ("Unrecoverable error")."""
    connection = kombu.Connection(REDIS_URL, transport="orchestrator.operations.broker:RedisTransport",
                                  transport_options={"global_keyprefix": redis_prefix})
    name = unique()
    queue = kombu.Queue(name, routing_key=name)
    channel = connection.channel()
    kombu.Producer(channel).publish({"step": 1}, routing_key=name, declare=[queue])
    delivered = []
    with kombu.Consumer(channel, [queue], callbacks=[lambda body, message: delivered.append(message)],
                        accept=["json"]):
        connection.drain_events(timeout=5)
    connection.transport.client = None  # what Connection.collect() leaves behind
    channel.close()
    message = delivered[0]
    if answer == "ack":
        message.ack_log_error(logging.getLogger(__name__), connection.connection_errors)
    else:
        message.reject_log_error(logging.getLogger(__name__), connection.connection_errors)
    assert "left to the visibility timeout" in caplog.text
