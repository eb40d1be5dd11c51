"""A real local HTTP server standing in for the outside world in tests.

It counts requests by Idempotency-Key and can be told to fail the first N requests with a
status (e.g. 500 or 429 with Retry-After), or to refuse every request to a path, so tests see
what a remote API would see.
"""
import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class HttpSink:
    def __init__(self):
        self.requests: list[dict] = []
        self.by_key: Counter = Counter()
        self.effects: Counter = Counter()  # keys whose request succeeded (the business effect)
        self.failures: list[tuple[int, dict, str | None]] = []  # (status, headers, path)
        self.delay_s = 0.0  # how long the remote takes before it acts
        self.arrived = 0  # requests received, including those still being handled
        self.arrivals: Counter = Counter()  # the same, by path
        self.refused: dict[str, int] = {}  # path -> the status every request to it gets
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                key = self.headers.get("Idempotency-Key", "")
                with sink._lock:
                    sink.arrived += 1
                    sink.arrivals[self.path] += 1
                if sink.delay_s:
                    time.sleep(sink.delay_s)
                with sink._lock:
                    sink.requests.append({"path": self.path, "key": key, "body": body.decode()})
                    sink.by_key[key] += 1
                    status, headers = sink._next_outcome(self.path)
                    if status == 200 and key and sink.effects[key]:
                        payload = {"ok": True, "duplicate": True}
                    elif status == 200:
                        sink.effects[key] += 1
                        payload = {"ok": True, "duplicate": False}
                    else:
                        payload = {"error": status}
                data = json.dumps(payload).encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_PUT = do_POST
            do_GET = do_POST

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def fail_next(self, count: int, status: int, headers: dict | None = None,
                  path: str | None = None) -> None:
        """Answer the next `count` requests (to `path`, if given) with `status`."""
        self.failures.extend([(status, headers or {}, path)] * count)

    def refuse(self, path: str, status: int) -> None:
        """Answer every request to `path` with `status` (e.g. 422: a permanent refusal)."""
        self.refused[path] = status

    def _next_outcome(self, path: str) -> tuple[int, dict]:
        if path in self.refused:
            return self.refused[path], {}
        for i, (status, headers, only) in enumerate(self.failures):
            if only is None or only == path:
                del self.failures[i]
                return status, headers
        return 200, {}

    def effects_at(self, path: str) -> int:
        return sum(1 for r in self.requests if r["path"] == path)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
