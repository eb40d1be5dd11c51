"""A TCP proxy the soak can hurt: added latency, every connection reset, or a partition.

The workers reach the database only through it. `latency(s)` delays every chunk it forwards;
`reset()` closes every connection at once (a network blip: the server is fine, the client's
socket is dead); `partition()` keeps connections open but forwards nothing and accepts nothing
new until `heal()`, which then resets what the partition held (as a real partition ends: the
clients' connections time out).
"""
import socket
import threading
import time


class FaultProxy:
    def __init__(self, host: str, port: int):
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.delay_s = 0.0
        self.partitioned = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            while self.partitioned.is_set() and not self._closed:
                time.sleep(0.05)  # a partition: the connection hangs, unanswered
            try:
                server = socket.create_connection(self.target, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()  # the database is down: as the client would see it
                continue
            with self._lock:
                self._sockets += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                while self.partitioned.is_set() and not self._closed:
                    time.sleep(0.05)
                if self.delay_s:
                    time.sleep(self.delay_s)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def reset(self) -> int:
        """Close every open connection; return how many were cut."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        return len(sockets) // 2

    def latency(self, seconds: float) -> None:
        self.delay_s = seconds

    def partition(self) -> None:
        self.partitioned.set()

    def heal(self) -> None:
        self.partitioned.clear()
        self.reset()

    def close(self) -> None:
        self._closed = True
        self.partitioned.clear()
        self.listener.close()
        self.reset()
