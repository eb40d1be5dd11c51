"""The embedded broker never hands a consumer a half-written message."""
import threading

import kombu

import orchestrator.operations.broker  # noqa: F401  (registers stepwisefs://)


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
