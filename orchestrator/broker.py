"""The embedded broker: Kombu's filesystem transport, made safe for several processes.

Kombu's filesystem transport creates a message file and then writes into it, so a consumer
in another process can pick the file up while it is still empty and crash on the JSON
("Unrecoverable error: JSONDecodeError"). Here a message is written to a staging folder and
moved into the queue folder with an atomic rename, so a consumer only ever sees whole
messages. Registered as the `stepwisefs://` transport; everything else is Kombu's.
"""
import os
import uuid
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


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


TRANSPORT_ALIASES["stepwisefs"] = "orchestrator.broker:Transport"
