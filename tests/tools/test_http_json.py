"""`http.json`: a JSON API on a named connection, its credential added by the tool, through the
egress client; a local HTTP server stands in for the API."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from .conftest import call, fails


class Api:
    def __init__(self):
        self.requests: list[dict] = []
        self.replies: list[tuple[int, dict, bytes]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                length = int(self.headers.get("Content-Length") or 0)
                api.requests.append({"method": self.command, "path": self.path,
                                     "headers": dict(self.headers),
                                     "body": self.rfile.read(length) if length else b""})
                status, headers, body = (api.replies.pop(0) if api.replies
                                         else (200, {}, json.dumps({"ok": True}).encode()))
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_PUT = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def api(connections, monkeypatch, tmp_path):
    monkeypatch.setenv("INTEGRATIONS_API_TOKEN", "t0ken-from-env")
    (tmp_path / "pw").write_text("s3cret-from-file")
    api = Api()
    connections(
        crm={"kind": "http", "base_url": f"{api.url}/api/v2",
             "auth": {"type": "bearer", "token": {"env": "INTEGRATIONS_API_TOKEN"}}},
        basic={"kind": "http", "base_url": api.url,
               "auth": {"type": "basic", "username": "svc", "password": {"file": str(tmp_path / "pw")}}},
        keyed={"kind": "http", "base_url": api.url,
               "auth": {"type": "header", "name": "X-Api-Key", "value": {"env": "INTEGRATIONS_API_TOKEN"}}})
    yield api
    api.server.shutdown()


def test_the_connection_adds_its_credential_and_the_step_never_sees_it(api):
    out = call("http.json", {"connection": "crm", "method": "POST", "path": "contacts",
                             "query": {"dry": "1"}, "json": {"name": "Ann"}},
               key="run-1:crm:default", side_effect=True)
    assert out == {"status": 200, "body": {"ok": True}}
    (request,) = api.requests
    assert request["path"] == "/api/v2/contacts?dry=1"
    assert request["headers"]["Authorization"] == "Bearer t0ken-from-env"
    assert request["headers"]["Idempotency-Key"] == "run-1:crm:default"  # a side effect
    assert json.loads(request["body"]) == {"name": "Ann"}
    call("http.json", {"connection": "basic", "path": "/me"})
    assert api.requests[-1]["headers"]["Authorization"] == "Basic c3ZjOnMzY3JldC1mcm9tLWZpbGU="
    call("http.json", {"connection": "keyed", "path": "/me"})
    assert api.requests[-1]["headers"]["X-Api-Key"] == "t0ken-from-env"
    assert "Authorization" not in api.requests[-1]["headers"]


@pytest.mark.parametrize("status, headers, error_class", [
    (429, {"Retry-After": "7"}, "rate_limit"), (503, {}, "transient"), (401, {}, "auth"),
    (404, {}, "permanent"), (504, {}, "timeout"),
])
def test_http_statuses_are_classified(api, status, headers, error_class):
    api.replies.append((status, headers, b'{"error": "t0ken-from-env"}'))
    error = fails(error_class, "http.json", {"connection": "crm", "path": "/x"})
    if status == 429:
        assert error.retry_after_s == 7


def test_a_step_cannot_leave_the_base_url_nor_set_the_credential(api):
    fails("policy", "http.json", {"connection": "crm", "path": "../../admin"})
    fails("validation", "http.json", {"connection": "crm", "path": "//evil.test/x"})
    fails("validation", "http.json", {"connection": "crm", "path": "http://evil.test/x"})
    fails("policy", "http.json", {"connection": "crm", "path": "/x",
                                  "headers": {"authorization": "Bearer mine"}})
    api.replies.append((200, {}, b"not json"))
    fails("permanent", "http.json", {"connection": "crm", "path": "/x"})
    assert [r["path"] for r in api.requests] == ["/api/v2/x"]
