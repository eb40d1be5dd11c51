"""A real local HTTP server standing in for the outside world in tests.

It records every request (`requests`, in the order they were answered, with the status given
and the time it arrived; `arrival_order`, in the order they arrived), which keys are being
handled right now (`open_keys`: a call a crash would lose the answer of), how many were being handled at once per path (`peak`), and counts effects
by Idempotency-Key two ways: `effects` as a remote that de-duplicates by the key would (a
repeated key is answered "duplicate" and not counted again), and `calls_by_key`, every
successful request whatever its key, as a remote that does NOT de-duplicate would have acted
on. It can be told to fail the first N requests with a status (e.g. 500 or 429 with
Retry-After), or to refuse every request to a path, so tests see what a remote API would see.

With `fenced=True` it is also a remote that checks fencing tokens: it keeps the highest
`Stepwise-Fencing-Token` it acted on per key and answers 409 to a request carrying an older one,
checked when the request is acted on (after any hold), not when it arrives — the moment a
stale writer's delayed request would do harm.
"""
import json
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOLD_LIMIT_S = 120  # a held request is answered after this long even if nobody releases it


class HttpSink:
    def __init__(self, *, fenced: bool = False):
        self.fenced = fenced
        self.fences: dict[str, int] = {}  # key -> the highest fencing token acted on
        self.stale_refused: list[tuple[str, int]] = []  # (key, token) refused as stale
        self.held_once: dict[str, threading.Event] = {}  # path -> hold only its next request
        self.requests: list[dict] = []
        self.by_key: Counter = Counter()
        self.effects: Counter = Counter()  # keys whose request succeeded (the business effect)
        self.calls_by_key: Counter = Counter()  # successful requests per key, duplicates included
        self.arrival_order: list[tuple[str, str]] = []  # (path, key) as requests arrived
        self.in_flight: Counter = Counter()  # requests being handled now, by path
        self.open_keys: Counter = Counter()  # requests being handled now, by Idempotency-Key
        self.peak: Counter = Counter()  # the most handled at once, by path
        self.failures: list[tuple[int, dict, str | None]] = []  # (status, headers, path)
        self.delay_s = 0.0  # how long the remote takes before it acts
        self.arrived = 0  # requests received, including those still being handled
        self.arrivals: Counter = Counter()  # the same, by path
        self.refused: dict[str, int] = {}  # path -> the status every request to it gets
        self.held: dict[str, threading.Event] = {}  # path -> released when set
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                key = self.headers.get("Idempotency-Key", "")
                token = int(self.headers.get("Stepwise-Fencing-Token") or 0)
                arrived_at = datetime.now(UTC)
                with sink._lock:
                    sink.arrived += 1
                    sink.arrivals[self.path] += 1
                    sink.arrival_order.append((self.path, key))
                    sink.in_flight[self.path] += 1
                    sink.open_keys[key] += 1
                    sink.peak[self.path] = max(sink.peak[self.path], sink.in_flight[self.path])
                    once = sink.held_once.pop(self.path, None)
                if sink.delay_s:
                    time.sleep(sink.delay_s)
                held = sink.held.get(self.path)
                if held is not None:
                    held.wait(timeout=HOLD_LIMIT_S)
                if once is not None:
                    once.wait(timeout=HOLD_LIMIT_S)
                with sink._lock:
                    # Handled once answered: counted out before the answer leaves, so a caller
                    # that sends its next request after reading it is never seen overlapping.
                    sink.in_flight[self.path] -= 1
                    sink.open_keys[key] -= 1
                    status, headers = sink._next_outcome(self.path)
                    if sink.fenced and status == 200:
                        if token < sink.fences.get(key, 0):
                            status, headers = 409, {}
                            sink.stale_refused.append((key, token))
                        else:
                            sink.fences[key] = token
                    sink.requests.append({"path": self.path, "key": key, "body": body.decode(),
                                          "headers": dict(self.headers.items()),
                                          "status": status, "arrived_at": arrived_at})
                    sink.by_key[key] += 1
                    if status == 200:
                        sink.calls_by_key[key] += 1
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

    def hold(self, path: str) -> None:
        """Keep every request to `path` waiting, unanswered, until `release(path)`: a call a
        test can act during for as long as it needs (at most HOLD_LIMIT_S)."""
        self.held[path] = threading.Event()

    def release(self, path: str) -> None:
        self.held.pop(path).set()

    def hold_next(self, path: str) -> threading.Event:
        """Keep only the next request to `path` waiting, until the returned event is set."""
        event = self.held_once[path] = threading.Event()
        return event

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
        for path in list(self.held):
            self.release(path)
        for event in self.held_once.values():
            event.set()
        self.server.shutdown()
        self.server.server_close()
