"""Publishing to the real RabbitMQ, Redis and Mosquitto on this machine: the message and its id,
each error class, and the refusals of what a connection does not allow."""
import json
import threading

import amqp
import paho.mqtt.client as mqtt
import pytest
import redis
from paho.mqtt.enums import CallbackAPIVersion

from orchestrator.integrations.tools.named import message_id
from tests.support.integrations import AMQP_URL, REDIS_URL, closed_port, need, unique
from tests.support.stall_proxy import StallProxy

from .conftest import call, fails


@pytest.fixture
def rabbit(connections, monkeypatch):
    """An exchange and a queue bound to it, both `integrations-<random>`, deleted after."""
    need("RabbitMQ")
    monkeypatch.setenv("INTEGRATIONS_AMQP_PW", "guest")
    name = unique()
    conn = amqp.Connection("127.0.0.1:5672", userid="guest", password="guest")
    conn.connect()
    channel = conn.channel()
    channel.exchange_declare(name, "topic", durable=False, auto_delete=False)
    channel.queue_declare(name, durable=False, auto_delete=False)
    channel.queue_bind(name, name, "orders.#")
    proxy = StallProxy("127.0.0.1", 5672)
    pw = {"env": "INTEGRATIONS_AMQP_PW"}
    connections(
        bus={"kind": "rabbitmq", "url": AMQP_URL, "password": pw, "exchanges": [name]},
        anywhere={"kind": "rabbitmq", "url": AMQP_URL, "password": pw},
        stalled={"kind": "rabbitmq", "url": f"amqp://guest@127.0.0.1:{proxy.port}//", "password": pw},
        wrong={"kind": "rabbitmq", "url": AMQP_URL, "password": {"env": "INTEGRATIONS_UNSET_PW"}},
        bad_login={"kind": "rabbitmq", "url": "amqp://integrations-nobody@127.0.0.1:5672//",
                   "password": pw},
        down={"kind": "rabbitmq", "url": f"amqp://guest@127.0.0.1:{closed_port()}//", "password": pw,
              "timeout_s": 2})
    yield name, channel, proxy
    proxy.close()
    channel.queue_delete(name)
    channel.exchange_delete(name)
    conn.close()


def test_rabbitmq_publish_is_confirmed_with_a_message_id_from_the_key(rabbit):
    name, channel, _ = rabbit
    key = "run-9:announce:default"
    out = call("rabbitmq.publish", {"connection": "bus", "exchange": name,
                                    "routing_key": "orders.eu", "message": {"total": 3}}, key=key)
    assert out == {"message_id": message_id(key), "exchange": name, "routing_key": "orders.eu"}
    got = channel.basic_get(name, no_ack=True)
    assert json.loads(got.body) == {"total": 3}
    assert got.properties["message_id"] == message_id(key)
    assert got.properties["delivery_mode"] == 2
    assert channel.basic_get(name) is None


def test_rabbitmq_failures_are_classified(rabbit):
    name, _, proxy = rabbit
    fails("policy", "rabbitmq.publish", {"connection": "bus", "exchange": "amq.topic", "message": 1})
    fails("permanent", "rabbitmq.publish", {"connection": "anywhere",
                                            "exchange": "integrations-no-such-exchange", "message": 1})
    fails("auth", "rabbitmq.publish", {"connection": "bad_login", "exchange": name, "message": 1})
    fails("transient", "rabbitmq.publish", {"connection": "down", "exchange": name, "message": 1})
    fails("policy", "rabbitmq.publish", {"connection": "wrong", "exchange": name, "message": 1})
    # The broker takes the publish but its confirm never arrives: a timeout.
    proxy.stall_on(b"\x00\x3c\x00\x28", deliver=False)  # basic.publish (class 60, method 40)
    fails("timeout", "rabbitmq.publish", {"connection": "stalled", "exchange": name,
                                          "message": 1, "timeout_s": 1})


@pytest.fixture
def streams(connections):
    need("Redis")
    client = redis.Redis.from_url(REDIS_URL)
    proxy = StallProxy("127.0.0.1", 6379)
    # This test's own keys: Redis database 13 is shared by every test process (the integration
    # rig's too), and each removes only what it made.
    prefix = f"{unique()}:"
    connections(
        events={"kind": "redis", "url": REDIS_URL, "key_prefix": prefix},
        stalled={"kind": "redis", "url": f"redis://127.0.0.1:{proxy.port}/13", "key_prefix": prefix},
        bad_login={"kind": "redis", "url": "redis://integrations-nobody@127.0.0.1:6379/13",
                   "password": {"env": "PATH"}, "key_prefix": prefix},
        down={"kind": "redis", "url": f"redis://127.0.0.1:{closed_port()}/13"})
    yield client, proxy, prefix
    proxy.close()
    keys = list(client.scan_iter(f"{prefix}*"))
    if keys:
        client.delete(*keys)


def test_redis_stream_add_appends_once_per_key(streams):
    client, _, prefix = streams
    stream = unique()
    first = call("redis.stream_add", {"connection": "events", "stream": stream,
                                      "message": {"a": 1}}, key="run-1:s:default")
    again = call("redis.stream_add", {"connection": "events", "stream": stream,
                                      "message": {"a": 1}}, key="run-1:s:default")
    other = call("redis.stream_add", {"connection": "events", "stream": stream,
                                      "message": {"a": 2}}, key="run-2:s:default")
    assert first["stream"] == f"{prefix}{stream}"
    assert (first["duplicate"], again["duplicate"]) == (False, True)
    assert again["entry_id"] == first["entry_id"] != other["entry_id"]
    entries = client.xrange(f"{prefix}{stream}")
    assert [(e[1][b"message_id"].decode(), json.loads(e[1][b"data"])) for e in entries] == [
        (message_id("run-1:s:default"), {"a": 1}), (message_id("run-2:s:default"), {"a": 2})]


def test_redis_failures_are_classified(streams):
    client, proxy, prefix = streams
    client.set(f"{prefix}plain", "x")
    fails("permanent", "redis.stream_add", {"connection": "events", "stream": "plain", "message": 1})
    fails("auth", "redis.stream_add", {"connection": "bad_login", "stream": "s", "message": 1})
    fails("transient", "redis.stream_add", {"connection": "down", "stream": "s", "message": 1})
    proxy.stall_on(b"EVAL", deliver=False)
    fails("timeout", "redis.stream_add", {"connection": "stalled", "stream": "s", "message": 1,
                                          "timeout_s": 0.5})


@pytest.fixture
def topics(connections):
    need("Mosquitto")
    proxy = StallProxy("127.0.0.1", 1883)
    connections(
        mqtt={"kind": "mqtt", "host": "127.0.0.1", "port": 1883, "topics": ["integrations/#"]},
        stalled={"kind": "mqtt", "host": "127.0.0.1", "port": proxy.port},
        down={"kind": "mqtt", "host": "127.0.0.1", "port": closed_port()})
    yield proxy
    proxy.close()


def subscriber(topic: str):
    received, ready = [], threading.Event()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.on_connect = lambda c, u, f, rc, p: c.subscribe(topic, qos=1)
    client.on_subscribe = lambda c, u, mid, rcs, p: ready.set()
    client.on_message = lambda c, u, message: received.append(message)
    client.connect("127.0.0.1", 1883)
    client.loop_start()
    assert ready.wait(10)
    return client, received


def test_mqtt_publish_is_acknowledged_and_carries_the_message_id(topics):
    topic = f"integrations/{unique()}"
    client, received = subscriber(topic)
    try:
        key = "run-5:notify:default"
        out = call("mqtt.publish", {"connection": "mqtt", "topic": topic,
                                    "message": {"door": "open"}}, key=key)
        assert out == {"message_id": message_id(key), "topic": topic, "qos": 1}
        for _ in range(100):
            if received:
                break
            threading.Event().wait(0.05)
        (message,) = received
        assert json.loads(message.payload) == {"door": "open"}
        assert ("message_id", message_id(key)) in message.properties.UserProperty
    finally:
        client.loop_stop()
        client.disconnect()


def test_mqtt_failures_are_classified(topics):
    proxy = topics
    fails("policy", "mqtt.publish", {"connection": "mqtt", "topic": "factory/door", "message": 1})
    fails("validation", "mqtt.publish", {"connection": "mqtt", "topic": "integrations/#", "message": 1})
    fails("transient", "mqtt.publish", {"connection": "down", "topic": "integrations/x", "message": 1})
    proxy.stall_on(b"integrations/stall", deliver=False)
    fails("timeout", "mqtt.publish", {"connection": "stalled", "topic": "integrations/stall",
                                      "message": 1, "timeout_s": 0.5})
