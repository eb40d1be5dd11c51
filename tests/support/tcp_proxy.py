"""A TCP proxy a test can cut: to a client, the server behind it went away.

`cut()` closes every connection and stops listening, as a crashed server would, without
touching the real server that other tests share; `resume()` listens on the same port again,
as the server coming back.
"""
import socket
import threading


class TcpProxy:
    def __init__(self, host: str, port: int):
        self.target = (host, port)
        self.sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self.port = 0
        self.resume()

    def resume(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", self.port))  # SO_REUSEADDR on POSIX
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # cut
            server = socket.create_connection(self.target)
            with self._lock:
                self.sockets += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        self.listener.close()
        with self._lock:
            for s in self.sockets:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
            self.sockets.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cut()
