"""Broker transports: Kombu's, with two fixes for failures the fault suite found.

The embedded broker (`stepwisefs://`): Kombu's filesystem transport creates a message file and
then writes into it, so a consumer in another process can pick the file up while it is still
empty and crash on the JSON ("Unrecoverable error: JSONDecodeError"). Here a message is written
to a staging folder and moved into the queue folder with an atomic rename, so a consumer only
ever sees whole messages.

Redis (`redis://`, used through the CELERY_BROKER_TRANSPORT setting): when the broker goes
away, Celery's consumer lets go of the connection before every channel of it is closed. Kombu
then answers for those channels over a connection it no longer has and dies with an
AttributeError, taking the whole worker down: when a closing channel restores its
unacknowledged messages, and when a task that ends later acknowledges or rejects its message
from the new connection's loop. Here those are skipped instead: the messages stay in Redis's
unacknowledged set (restored after the visibility timeout, a replay the engine refuses), the
reaper re-sends anything the database says is still owed, and the worker goes on.
"""
import logging
import os
import uuid
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import TRANSPORT_ALIASES, filesystem, redis
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

log = logging.getLogger(__name__)


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        staging = os.path.join(self.data_folder_out, ".staging")
        os.makedirs(staging, exist_ok=True)
        temporary = os.path.join(staging, name)
        try:
            with open(temporary, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(temporary, os.path.join(self.data_folder_out, name))
        except OSError as exc:
            raise ChannelError(f"Cannot add message {name!r} to {self.data_folder_out!r}") from exc


class Transport(filesystem.Transport):
    Channel = Channel
    driver_type = driver_name = "stepwisefs"


TRANSPORT_ALIASES["stepwisefs"] = "orchestrator.operations.broker:Transport"


class RedisQoS(redis.QoS):
    def restore_unacked(self, client=None):
        if client is None and self._connection_gone():
            log.warning("broker connection already closed: %d unacknowledged message(s) left "
                        "to the visibility timeout and the reaper", len(self._delivered))
            self._delivered.clear()
            return
        return super().restore_unacked(client)

    def ack(self, delivery_tag):
        if self._connection_gone():
            self._leave(delivery_tag)
            return
        super().ack(delivery_tag)

    def reject(self, delivery_tag, requeue=False):
        if self._connection_gone():
            self._leave(delivery_tag)
            return
        super().reject(delivery_tag, requeue=requeue)

    def _connection_gone(self) -> bool:
        transport = self.channel.connection
        return transport is None or transport.client is None

    def _leave(self, delivery_tag) -> None:
        log.warning("broker connection already closed: the answer to one of its messages is "
                    "dropped; the message is left to the visibility timeout and the reaper")
        self._delivered.pop(delivery_tag, None)


class RedisChannel(redis.Channel):
    QoS = RedisQoS


class RedisTransport(redis.Transport):
    Channel = RedisChannel
