"""A real local HTTP server speaking the OpenAI and Anthropic APIs, for provider tests.

`POST /v1/chat/completions` (OpenAI-compatible) and `POST /v1/messages` (Anthropic) answer
like the real APIs do, with behaviours the test chooses:

* `reply(value)`: a well-formed answer through the channel the request offered (a
  `respond` tool call if it offered tools, else JSON text);
* `text(raw)`: raw text, e.g. malformed JSON or JSON with extra fields;
* `status(code, headers)`: an HTTP error, e.g. 429 with Retry-After, 500, 401;
* `slow(seconds, then)`: wait before answering (to trip a client timeout);
* `call(tool, arguments)`: a call of some tool the request never offered.

Behaviours queued with `then(...)` answer the next requests in order; rules added with
`when_prompt_contains(text, behaviour)` answer any request whose messages contain `text` —
that is how the fake "obeys" a prompt injection. Otherwise `default` answers. Every request
is recorded (path, headers, body, time) for the test to inspect, and counted as a provider
would meter it: the most requests in flight at once (`most_in_flight`, and per requested model
`most_in_flight_of`) and the tokens answered in each calendar minute (`tokens_by_minute`).
"""
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL_VERSION = "fake-model-2025-01-01"
TOKENS_IN, TOKENS_OUT = 11, 7
# What the provider suites ask: classify a ticket into one of two categories.
SCHEMA = {"type": "object", "required": ["category"],
          "properties": {"category": {"enum": ["billing", "technical"]}}}


def ask(provider_class, config: dict, **fields):
    """One classification request through `provider_class` configured with `config`."""
    from orchestrator.integrations.providers import ModelRequest

    request = ModelRequest(model=config["model_id"], prompt="Classify: my invoice is wrong",
                           system="You classify tickets.", output_schema=SCHEMA, **fields)
    return provider_class(config).complete(request)


@dataclass
class Behaviour:
    kind: str
    value: object = None
    code: int = 200
    headers: dict = field(default_factory=dict)
    seconds: float = 0.0
    then: "Behaviour | None" = None
    tool: str = ""


def reply(value) -> Behaviour:
    return Behaviour("reply", value)


def text(raw: str) -> Behaviour:
    return Behaviour("text", raw)


def status(code: int, headers: dict | None = None, message: str = "fake error") -> Behaviour:
    return Behaviour("status", message, code=code, headers=headers or {})


def slow(seconds: float, then: Behaviour) -> Behaviour:
    return Behaviour("slow", seconds=seconds, then=then)


def call(tool: str, arguments: dict) -> Behaviour:
    return Behaviour("call", arguments, tool=tool)


class FakeLLM:
    def __init__(self, default: Behaviour | None = None):
        self.default = default or text("{}")
        self.queue: list[Behaviour] = []
        self.rules: list[tuple[str, Behaviour]] = []
        self.requests: list[dict] = []
        self.in_flight = self.most_in_flight = 0
        self.in_flight_of: Counter = Counter()       # by the request's "model"
        self.most_in_flight_of: Counter = Counter()
        self.tokens_by_minute: dict[int, int] = {}
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with fake._lock:
                    fake.requests.append({"path": self.path, "headers": dict(self.headers),
                                          "body": body, "at": time.monotonic()})
                    behaviour = fake._choose(body)
                    fake.in_flight += 1
                    fake.most_in_flight = max(fake.most_in_flight, fake.in_flight)
                    model = body.get("model")
                    fake.in_flight_of[model] += 1
                    fake.most_in_flight_of[model] = max(fake.most_in_flight_of[model], fake.in_flight_of[model])
                try:
                    fake._answer(self, body, behaviour)
                finally:
                    with fake._lock:
                        fake.in_flight -= 1
                        fake.in_flight_of[model] -= 1
                        if behaviour.kind != "status":
                            minute = int(time.time() // 60)
                            fake.tokens_by_minute[minute] = (fake.tokens_by_minute.get(minute, 0)
                                                             + TOKENS_IN + TOKENS_OUT)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    # --- what the test says ---------------------------------------------------------------

    def then(self, *behaviours: Behaviour) -> "FakeLLM":
        with self._lock:
            self.queue.extend(behaviours)
        return self

    def when_prompt_contains(self, needle: str, behaviour: Behaviour) -> "FakeLLM":
        with self._lock:
            self.rules.append((needle, behaviour))
        return self

    def reset(self) -> None:
        with self._lock:
            self.queue.clear()
            self.rules.clear()
            self.requests.clear()
            # A request still being answered stays counted: zeroed, its end would take the
            # count below zero and hide one request of the next test.
            self.most_in_flight = self.in_flight
            self.most_in_flight_of = Counter(self.in_flight_of)
            self.tokens_by_minute.clear()

    @property
    def openai_base_url(self) -> str:
        return f"{self.url}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    # --- how it answers ------------------------------------------------------------------

    def _choose(self, body: dict) -> Behaviour:
        conversation = json.dumps(body.get("messages", [])) + json.dumps(body.get("system", ""))
        for needle, behaviour in self.rules:
            if needle in conversation:
                return behaviour
        if self.queue:
            return self.queue.pop(0)
        return self.default

    def _answer(self, handler, body: dict, behaviour: Behaviour) -> None:
        anthropic = handler.path.startswith("/v1/messages")
        if behaviour.kind == "slow":
            time.sleep(behaviour.seconds)
            behaviour = behaviour.then
        if behaviour.kind == "status":
            if anthropic:
                payload = {"type": "error", "error": {"type": "api_error", "message": behaviour.value}}
            else:
                payload = {"error": {"message": behaviour.value, "type": "fake_error"}}
            return _send(handler, behaviour.code, payload, behaviour.headers)
        offered_tools = bool(body.get("tools"))
        if behaviour.kind == "reply" and offered_tools:
            behaviour = call("respond", behaviour.value)
        elif behaviour.kind == "reply":
            behaviour = text(json.dumps(behaviour.value))
        if anthropic:
            return _send(handler, 200, _anthropic(behaviour))
        return _send(handler, 200, _openai(behaviour))


def _openai(behaviour: Behaviour) -> dict:
    message: dict = {"role": "assistant", "content": None}
    finish = "stop"
    if behaviour.kind == "call":
        message["tool_calls"] = [{"id": "call_1", "type": "function", "function": {
            "name": behaviour.tool, "arguments": json.dumps(behaviour.value)}}]
        finish = "tool_calls"
    else:
        message["content"] = behaviour.value
    return {"id": "chatcmpl-fake", "object": "chat.completion", "model": MODEL_VERSION,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": TOKENS_IN, "completion_tokens": TOKENS_OUT,
                      "total_tokens": TOKENS_IN + TOKENS_OUT}}


def _anthropic(behaviour: Behaviour) -> dict:
    if behaviour.kind == "call":
        content = [{"type": "tool_use", "id": "toolu_1", "name": behaviour.tool,
                    "input": behaviour.value}]
        stop = "tool_use"
    else:
        content = [{"type": "text", "text": behaviour.value}]
        stop = "end_turn"
    return {"id": "msg_fake", "type": "message", "role": "assistant", "model": MODEL_VERSION,
            "content": content, "stop_reason": stop,
            "usage": {"input_tokens": TOKENS_IN, "output_tokens": TOKENS_OUT}}


def _send(handler, code: int, payload: dict, headers: dict | None = None) -> None:
    data = json.dumps(payload).encode()
    try:
        handler.send_response(code)
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
    except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
        pass
