"""Message broker tools: publish to a RabbitMQ exchange (`rabbitmq.publish`), append to a Redis
stream (`redis.stream_add`), publish to an MQTT topic (`mqtt.publish`), each on a named
connection, with a message id derived from the step's idempotency key.

What each guarantees when a worker dies mid-call and the step is retried:
* `redis.stream_add` is exactly-once: one Lua script, atomic in Redis, records the message id
  under a dedupe key (kept `dedupe_ttl_s`, default 7 days) and appends the entry only if the
  id is new; a repeat returns the first entry's id.
* `rabbitmq.publish` (publisher confirms: the call returns once the broker has taken the
  message) and `mqtt.publish` (QoS 1 by default: once the broker acknowledged it) are
  at-least-once with a stable `message_id`: a worker dying after the broker took the message
  but before the step's success was recorded publishes it again with the same id, and a
  consumer that remembers ids drops the repeat. Neither broker can be asked whether it holds
  a message, so there is no lookup; the effect ledger repeats the call (`dedupes_by_key`).

Least privilege: a connection may list the `exchanges` (RabbitMQ) or topic filters (`topics`,
MQTT) a step may publish to, and a Redis connection's `key_prefix` is put before every stream
name. Nothing is declared: exchanges and streams are the operator's.
"""
import json
import secrets
import socket
import threading
from urllib.parse import quote, urlsplit, urlunsplit

import amqp.exceptions
import kombu
import kombu.exceptions
import paho.mqtt.client as mqtt
import redis
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from orchestrator.engine.retry import StepError

from ..connections import Connection
from .named import CONNECTION_PARAM, connection_for, deadline_s, failure, message_id
from .registry import FENCING_HEADER, ToolContext, tool

DEDUPE_TTL_S = 7 * 24 * 3600
MAX_MESSAGE_BYTES = 1024 * 1024

_MESSAGE = {"description": "The message: any JSON value, sent as JSON."}
_HEADERS = {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]},
            "maxProperties": 50}
_TIMEOUT = {"type": "number", "exclusiveMinimum": 0, "default": 10}

RABBITMQ_PARAMS = {
    "type": "object", "additionalProperties": False,
    "required": ["connection", "exchange", "message"],
    "properties": {"connection": CONNECTION_PARAM,
                   "exchange": {"type": "string", "maxLength": 255,
                                "description": "An existing exchange ('' is the default one)."},
                   "routing_key": {"type": "string", "maxLength": 255, "default": ""},
                   "message": _MESSAGE, "headers": _HEADERS,
                   "persistent": {"type": "boolean", "default": True},
                   "timeout_s": _TIMEOUT},
}
REDIS_PARAMS = {
    "type": "object", "additionalProperties": False,
    "required": ["connection", "stream", "message"],
    "properties": {"connection": CONNECTION_PARAM,
                   "stream": {"type": "string", "minLength": 1, "maxLength": 200,
                              "description": "The stream, after the connection's key_prefix."},
                   "message": _MESSAGE,
                   "max_len": {"type": "integer", "minimum": 1,
                               "description": "Trim the stream to about this many entries."},
                   "timeout_s": _TIMEOUT},
}
MQTT_PARAMS = {
    "type": "object", "additionalProperties": False,
    "required": ["connection", "topic", "message"],
    "properties": {"connection": CONNECTION_PARAM,
                   "topic": {"type": "string", "minLength": 1, "maxLength": 1024,
                             "pattern": r"^[^#+\x00]+$",
                             "description": "A topic name (no wildcards)."},
                   "message": _MESSAGE,
                   "qos": {"type": "integer", "enum": [0, 1, 2]},
                   "retain": {"type": "boolean", "default": False},
                   "timeout_s": _TIMEOUT},
}
PUBLISHED = {"type": "object", "required": ["message_id"],
             "properties": {"message_id": {"type": "string"}}}
RABBITMQ_OUTPUT = {**PUBLISHED, "required": ["message_id", "exchange", "routing_key"],
                   "properties": {**PUBLISHED["properties"], "exchange": {"type": "string"},
                                  "routing_key": {"type": "string"}}}
REDIS_OUTPUT = {**PUBLISHED, "required": ["message_id", "stream", "entry_id", "duplicate"],
                "properties": {**PUBLISHED["properties"], "stream": {"type": "string"},
                               "entry_id": {"type": "string"}, "duplicate": {"type": "boolean"}}}
MQTT_OUTPUT = {**PUBLISHED, "required": ["message_id", "topic", "qos"],
               "properties": {**PUBLISHED["properties"], "topic": {"type": "string"},
                              "qos": {"type": "integer"}}}


def _body(params: dict) -> bytes:
    body = json.dumps(params.get("message"), separators=(",", ":"), ensure_ascii=False).encode()
    if len(body) > MAX_MESSAGE_BYTES:
        raise StepError("permanent", f"the message is {len(body)} bytes; the limit is "
                                     f"{MAX_MESSAGE_BYTES}")
    return body


def _with_password(url: str, password: str | None) -> str:
    if password is None:
        return url
    parts = urlsplit(url)
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


# --- RabbitMQ ---------------------------------------------------------------------------------

def check_exchange(params: dict, connection) -> list[tuple[tuple, str]]:
    allowed = connection.get("exchanges") if connection is not None else None
    exchange = params.get("exchange")
    if allowed is not None and isinstance(exchange, str) and "{" not in exchange \
            and exchange not in allowed:
        return [(("exchange",), f"connection '{connection.name}' allows publishing only to "
                                f"{', '.join(repr(e) for e in allowed) or 'no exchange'}")]
    return []


def _amqp_failure(connection: Connection, exc: BaseException) -> StepError:
    if isinstance(exc, amqp.exceptions.AccessRefused):
        return failure(connection, "auth", exc)
    if isinstance(exc, amqp.exceptions.NotFound | amqp.exceptions.PreconditionFailed
                  | amqp.exceptions.NotAllowed | amqp.exceptions.InvalidPath):
        return failure(connection, "permanent", exc)
    if isinstance(exc, socket.timeout | TimeoutError):
        return failure(connection, "timeout", "the broker did not confirm the message in time")
    if isinstance(exc, amqp.exceptions.MessageNacked):
        return failure(connection, "transient", "the broker refused the message (nack)")
    return failure(connection, "transient", exc)  # connection refused, reset, forced close ...


@tool("rabbitmq.publish", params_schema=RABBITMQ_PARAMS, output_schema=RABBITMQ_OUTPUT,
      connection="rabbitmq", side_effect=True, dedupes_by_key=True, check=check_exchange,
      description="Publish a JSON message to a RabbitMQ exchange, confirmed by the broker.")
def rabbitmq_publish(params: dict, ctx: ToolContext) -> dict:
    """Publish once the broker confirms it; `message_id` is derived from the idempotency key."""
    connection = connection_for(params, ctx, "rabbitmq")
    if check_exchange(params, connection):
        raise StepError("policy", check_exchange(params, connection)[0][1])
    body = _body(params)
    mid = message_id(ctx.idempotency_key)
    seconds = deadline_s(connection, params, ctx, default=10)
    url = _with_password(connection.secret("url"), connection.secret("password"))
    try:
        with kombu.Connection(url, connect_timeout=seconds,
                              transport_options={"confirm_publish": True,
                                                 # Every read and write of the call is bounded,
                                                 # the handshake's included.
                                                 "read_timeout": seconds,
                                                 "write_timeout": seconds}) as conn:
            conn.ensure_connection(max_retries=1, timeout=seconds)
            producer = conn.Producer(serializer=None, auto_declare=False)
            producer.publish(
                body, exchange=params["exchange"], routing_key=params.get("routing_key", ""),
                content_type="application/json", content_encoding="utf-8",
                delivery_mode=2 if params.get("persistent", True) else 1,
                message_id=mid, headers={**(params.get("headers") or {}),
                                         "x-stepwise-step": ctx.step_name,
                                         # A consumer refuses a token older than one it saw.
                                         FENCING_HEADER: ctx.fencing_token},
                timeout=seconds, confirm_timeout=seconds, retry=False)
    except StepError:
        raise
    except (amqp.exceptions.AMQPError, kombu.exceptions.KombuError, OSError) as exc:
        raise _amqp_failure(connection, exc) from exc
    return {"message_id": mid, "exchange": params["exchange"],
            "routing_key": params.get("routing_key", "")}


# --- Redis streams ----------------------------------------------------------------------------

# KEYS: stream, dedupe key. ARGV: message id, data, max_len (0: none), ttl, fencing token.
# One script, so recording the id and appending the entry happen together or not at all.
_XADD_ONCE = """
local seen = redis.call('GET', KEYS[2])
if seen then return {seen, 1} end
local id
if tonumber(ARGV[3]) > 0 then
  id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], '*', 'message_id', ARGV[1], 'data', ARGV[2], 'fencing_token', ARGV[5])
else
  id = redis.call('XADD', KEYS[1], '*', 'message_id', ARGV[1], 'data', ARGV[2], 'fencing_token', ARGV[5])
end
redis.call('SET', KEYS[2], id, 'EX', ARGV[4])
return {id, 0}
"""


def _redis_failure(connection: Connection, exc: BaseException) -> StepError:
    if isinstance(exc, redis.AuthenticationError | redis.exceptions.NoPermissionError):
        return failure(connection, "auth", exc)
    if isinstance(exc, redis.TimeoutError):
        return failure(connection, "timeout", exc)
    if isinstance(exc, redis.ConnectionError | OSError):
        return failure(connection, "transient", exc)
    text = str(exc)
    if text.startswith(("NOAUTH", "WRONGPASS", "NOPERM")):
        return failure(connection, "auth", exc)
    if text.startswith(("OOM", "BUSY", "LOADING", "MASTERDOWN", "TRYAGAIN", "READONLY")):
        return failure(connection, "transient", exc)
    return failure(connection, "permanent", exc)  # WRONGTYPE, a bad argument ...


@tool("redis.stream_add", params_schema=REDIS_PARAMS, output_schema=REDIS_OUTPUT,
      connection="redis", side_effect=True, dedupes_by_key=True,
      description="Append a JSON message to a Redis stream, exactly once per step.")
def redis_stream_add(params: dict, ctx: ToolContext) -> dict:
    """XADD {message_id, data} to the stream unless this message id was added already."""
    connection = connection_for(params, ctx, "redis")
    body = _body(params)
    mid = message_id(ctx.idempotency_key)
    prefix = str(connection.get("key_prefix") or "")
    stream = prefix + params["stream"]
    max_len = int(params.get("max_len") or connection.get("max_len") or 0)
    ttl = int(connection.get("dedupe_ttl_s") or DEDUPE_TTL_S)
    seconds = deadline_s(connection, params, ctx, default=10)
    try:
        client = redis.Redis.from_url(connection.secret("url"),
                                      password=connection.secret("password"),
                                      socket_timeout=seconds, socket_connect_timeout=seconds)
        try:
            entry_id, seen = client.eval(_XADD_ONCE, 2, stream, f"{prefix}stepwise-dedupe:{mid}",
                                         mid, body, max_len, ttl, ctx.fencing_token)
        finally:
            client.close()
    except redis.RedisError as exc:
        raise _redis_failure(connection, exc) from exc
    entry = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    return {"message_id": mid, "stream": stream, "entry_id": entry, "duplicate": bool(seen)}


# --- MQTT -------------------------------------------------------------------------------------

def check_topic(params: dict, connection) -> list[tuple[tuple, str]]:
    allowed = connection.get("topics") if connection is not None else None
    topic = params.get("topic")
    if allowed is not None and isinstance(topic, str) and "{" not in topic and not any(
            mqtt.topic_matches_sub(pattern, topic) for pattern in allowed):
        return [(("topic",), f"connection '{connection.name}' allows publishing only to "
                             f"{', '.join(allowed) or 'no topic'}")]
    return []


@tool("mqtt.publish", params_schema=MQTT_PARAMS, output_schema=MQTT_OUTPUT, connection="mqtt",
      side_effect=True, dedupes_by_key=True, check=check_topic,
      description="Publish a JSON message to an MQTT topic (MQTT 5, QoS 1 by default).")
def mqtt_publish(params: dict, ctx: ToolContext) -> dict:
    """Publish and wait for the broker's acknowledgement (QoS 1 and 2); the message id travels
    as the MQTT 5 user property `message_id` and as the correlation data."""
    connection = connection_for(params, ctx, "mqtt")
    if check_topic(params, connection):
        raise StepError("policy", check_topic(params, connection)[0][1])
    body = _body(params)
    mid = message_id(ctx.idempotency_key)
    qos = int(params.get("qos", connection.get("qos", 1)))
    seconds = deadline_s(connection, params, ctx, default=10)
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"stepwise-{secrets.token_hex(8)}",
                         protocol=mqtt.MQTTv5)
    if connection.get("username"):
        client.username_pw_set(str(connection.get("username")), connection.secret("password"))
    connected, acknowledged = threading.Event(), threading.Event()
    outcome: dict = {}

    def on_connect(client, userdata, flags, reason_code, properties):
        outcome["connack"] = reason_code
        connected.set()

    def on_publish(client, userdata, mid_, reason_code, properties):
        outcome["puback"] = reason_code
        acknowledged.set()

    client.on_connect, client.on_publish = on_connect, on_publish
    properties = Properties(PacketTypes.PUBLISH)
    properties.UserProperty = [("message_id", mid), ("step", ctx.step_name),
                               (FENCING_HEADER, str(ctx.fencing_token))]
    properties.CorrelationData = mid.encode()
    properties.ContentType = "application/json"
    try:
        client.connect(str(connection.get("host")), int(connection.get("port") or 1883),
                       keepalive=max(int(seconds) * 2, 10))
        client.loop_start()
        try:
            if not connected.wait(seconds):
                raise failure(connection, "timeout", "the broker did not answer the connect in time")
            connack = outcome["connack"]
            if connack.is_failure:
                error_class = "auth" if connack.value in (134, 135, 4, 5) else "transient"
                raise failure(connection, error_class, f"the broker refused the connection: {connack}")
            info = client.publish(params["topic"], body, qos=qos, retain=params.get("retain", False),
                                  properties=properties)
            if info.rc != mqtt.MQTT_ERR_SUCCESS:
                raise failure(connection, "transient", f"publish failed: {mqtt.error_string(info.rc)}")
            if qos and not acknowledged.wait(seconds):
                raise failure(connection, "timeout", "the broker did not acknowledge the message "
                                                     "in time")
            puback = outcome.get("puback")
            if puback is not None and puback.is_failure:
                error_class = "auth" if puback.value == 135 else "permanent"
                raise failure(connection, error_class, f"the broker refused the message: {puback}")
        finally:
            client.disconnect()
            client.loop_stop()
    except StepError:
        raise
    except (OSError, ValueError) as exc:
        raise failure(connection, "timeout" if isinstance(exc, socket.timeout | TimeoutError)
                      else "transient", exc) from exc
    return {"message_id": mid, "topic": params["topic"], "qos": qos}
