"""A TCP proxy that freezes one connection at a chosen moment, for killing a worker mid-call.

`stall_on(marker, deliver=...)`: the first time a client sends bytes containing `marker`
(e.g. the SQL `COMMIT`, an AMQP basic.publish frame, an SMTP `DATA` end), the proxy either
delivers that chunk to the server and then forwards nothing more in either direction
(`deliver=True`: the server acted, the client never hears back), or forwards nothing from that
chunk on (`deliver=False`: the server never saw it). The client waits for an answer that never
comes, so a test can kill the worker exactly there. Other connections, before and after, pass
through untouched. `stalled` is set when it happened. While `refusing` is set, every new
connection is closed at once, as a server that went away.
"""
import socket
import threading


class StallProxy:
    def __init__(self, host: str, port: int):
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.marker: bytes | None = None
        self.deliver = False
        self.stalled = threading.Event()
        self.refusing = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def stall_on(self, marker: bytes, *, deliver: bool) -> None:
        self.marker, self.deliver = marker, deliver
        self.stalled.clear()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.refusing:
                client.close()
                continue
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            frozen = threading.Event()
            with self._lock:
                self._sockets += [client, server]
            threading.Thread(target=self._pipe, args=(client, server, frozen, True),
                             daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, frozen, False),
                             daemon=True).start()

    def _pipe(self, source, sink, frozen: threading.Event, upstream: bool) -> None:
        try:
            while data := source.recv(65536):
                if upstream and self.marker and self.marker in data and not self.stalled.is_set():
                    with self._lock:
                        first = not self.stalled.is_set()
                        self.stalled.set()
                    if first:
                        frozen.set()  # before delivering: the reply must not slip back through
                        if self.deliver:
                            sink.sendall(data)
                        continue
                if frozen.is_set() and not (upstream and self.deliver):
                    # Swallowed: the other side never hears of it. A delivered command's rest,
                    # when it came in a later chunk, still goes to the server.
                    continue
                sink.sendall(data)
        except OSError:
            pass
        finally:
            if not frozen.is_set():
                for s in (source, sink):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
            else:
                # The client went away (killed): let the server see it go, as it would.
                for s in (source, sink):
                    try:
                        s.close()
                    except OSError:
                        pass

    def close(self) -> None:
        self.listener.close()
        with self._lock:
            for s in self._sockets:
                try:
                    s.close()
                except OSError:
                    pass
