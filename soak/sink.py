"""The soak's remote: a local HTTP server that acts once per Idempotency-Key and checks fencing.

It acts like a payments API would: the first successful request for a key is the effect
(`effects[key]`); a repeat of the key is answered "duplicate" without acting again; a request
whose `Stepwise-Fencing-Token` is older than one it acted on for that key is refused (409), the
way a fenced remote refuses a stale writer. It also counts every successful request
(`answered_ok[key]`): what a remote WITHOUT de-duplication would have acted on, which the
checker compares with the lost outcomes the effect ledger reconciled. Some paths are refused
for good (422), and `transient_rate` of the others answer 503 once in a while.
"""
import json
import random
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Sink:
    def __init__(self, *, seed: int, refused: dict[str, int], transient_rate: float):
        self.effects: Counter = Counter()
        self.answered_ok: Counter = Counter()
        self.stale_refused: Counter = Counter()
        self.transient_served: Counter = Counter()
        self.fences: dict[str, int] = {}
        self.paths: dict[str, str] = {}  # key -> path
        self.requests = 0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                key = self.headers.get("Idempotency-Key", "")
                token = int(self.headers.get("Stepwise-Fencing-Token") or 0)
                status, payload = sink.handle(self.path, key, token, refused, transient_rate)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True, name="sink").start()

    def handle(self, path: str, key: str, token: int, refused: dict, transient_rate: float):
        with self._lock:
            self.requests += 1
            self.paths.setdefault(key, path)
            if path in refused:
                return refused[path], {"error": "refused"}
            if token < self.fences.get(key, 0):
                self.stale_refused[key] += 1
                return 409, {"error": "stale fencing token"}
            if self._rng.random() < transient_rate:
                self.transient_served[path] += 1
                return 503, {"error": "try again"}
            self.fences[key] = max(token, self.fences.get(key, 0))
            self.answered_ok[key] += 1
            if self.effects[key]:
                return 200, {"ok": True, "duplicate": True}
            self.effects[key] += 1
            return 200, {"ok": True, "duplicate": False}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
