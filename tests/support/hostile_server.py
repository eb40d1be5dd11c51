"""A real local HTTP server that answers the way a hostile or broken remote does.

Paths:
* `/ok` - a small JSON body;
* `/big?mb=N` - N MiB with a Content-Length that says so;
* `/chunked?mb=N` - N MiB in chunks, with no length declared;
* `/gzip-bomb?mb=N` - N MiB of zeros, gzip-compressed to a few KiB;
* `/trickle?bytes=N&every=S` - headers at once, then one body byte every S seconds;
* `/redirect?to=URL` (302) and `/redirect-307?to=URL` (307).

It listens on 127.0.0.1 (and records every request: path and Host header), so a test sees
whether a call reached it at all, and through which name. `sent` counts body bytes written;
`finished` says, per answer, whether the client hung up before it was whole.
"""
import gzip
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

MiB = 1024 * 1024


class HostileServer:
    def __init__(self, host: str = "127.0.0.1"):
        self.requests: list[dict] = []
        self.finished: list[dict] = []  # per answered request: whether the client hung up
        self.sent = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                parts = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                with server._lock:
                    server.requests.append({"path": parts.path, "host": self.headers.get("Host"),
                                            "method": self.command})
                broken = False
                try:
                    getattr(self, "serve_" + parts.path.strip("/").replace("-", "_"),
                            self.serve_ok)(query)
                except (BrokenPipeError, ConnectionResetError):
                    broken = True  # the client stopped reading: what a size cap or deadline does
                with server._lock:
                    server.finished.append({"path": parts.path, "broken": broken})

            do_POST = do_GET

            def write(self, data: bytes) -> None:
                self.wfile.write(data)
                self.wfile.flush()
                with server._lock:
                    server.sent += len(data)

            def head(self, status: int = 200, **headers) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name.replace("_", "-"), str(value))
                self.end_headers()

            def serve_ok(self, query):
                data = json.dumps({"ok": True}).encode()
                self.head(200, Content_Type="application/json", Content_Length=len(data))
                self.write(data)

            def serve_big(self, query):
                size = int(float(query.get("mb", "40")) * MiB)
                self.head(200, Content_Type="text/plain", Content_Length=size)
                for _ in range(size // MiB):
                    self.write(b"a" * MiB)
                self.write(b"a" * (size % MiB))

            def serve_chunked(self, query):
                size = int(float(query.get("mb", "40")) * MiB)
                self.head(200, Content_Type="text/plain", Transfer_Encoding="chunked")
                chunk = b"a" * (64 * 1024)
                for _ in range(size // len(chunk)):
                    self.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.write(b"0\r\n\r\n")

            def serve_gzip_bomb(self, query):
                data = gzip.compress(b"\0" * int(float(query.get("mb", "40")) * MiB))
                self.head(200, Content_Type="text/plain", Content_Encoding="gzip",
                          Content_Length=len(data))
                self.write(data)

            def serve_trickle(self, query):
                count, every = int(query.get("bytes", "60")), float(query.get("every", "0.1"))
                self.head(200, Content_Type="text/plain", Content_Length=count)
                for _ in range(count):
                    self.write(b"a")
                    time.sleep(every)

            def serve_redirect(self, query, status=302):
                self.head(status, Location=query["to"], Content_Length=0)

            def serve_redirect_307(self, query):
                self.serve_redirect(query, status=307)

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()
