"""Request bodies are bounded at the ASGI level, before Django reads them: a declared
Content-Length past STEPWISE_MAX_REQUEST_BYTES is refused without reading a byte, and a body
without one (chunked) is refused once the bytes that arrived pass the limit — an anonymous
request to a path that does not exist included (Django would spool it all for the 404)."""
import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from orchestrator.asgi import application

LIMIT = 64 * 1024
CHUNK = 16 * 1024


@pytest.fixture(autouse=True)
def small_limit(settings):
    settings.STEPWISE_MAX_REQUEST_BYTES = LIMIT


def post(path: str, *, total: int, declared: bool) -> tuple[dict, bytes, int]:
    """POST `total` bytes in chunks; (the response start, its body, how many chunks were read)."""
    headers = [(b"host", b"testserver"), (b"content-type", b"application/json")]
    if declared:
        headers.append((b"content-length", str(total).encode()))
    else:
        headers.append((b"transfer-encoding", b"chunked"))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": headers, "client": ("127.0.0.1", 5000),
             "server": ("testserver", 80)}
    chunks = -(-total // CHUNK)
    read = 0
    sent = []

    async def receive():
        nonlocal read
        if read >= chunks:
            await asyncio.sleep(3600)  # the client has nothing more; it waits for the answer
        read += 1
        return {"type": "http.request", "body": b"x" * CHUNK, "more_body": read < chunks}

    async def send(message):
        sent.append(message)

    # In a thread of its own: a session-wide browser (Playwright's sync API) may hold a running
    # event loop in this one.
    with ThreadPoolExecutor(1) as thread:
        thread.submit(asyncio.run, asyncio.wait_for(application(scope, receive, send),
                                                    timeout=30)).result()
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start, body, read


@pytest.mark.parametrize("path", ["/no/such/path/", "/api/v1/workflows/", "/webhooks/nothing/"])
def test_a_declared_length_past_the_limit_is_refused_before_a_byte_is_read(path):
    start, body, read = post(path, total=100 * 1024 * 1024, declared=True)
    assert start["status"] == 413 and read == 0
    assert "STEPWISE_MAX_REQUEST_BYTES" in json.loads(body)["errors"][0]["message"]


@pytest.mark.parametrize("path", ["/no/such/path/", "/api/v1/workflows/"])
def test_a_chunked_body_is_refused_once_it_passes_the_limit(path):
    start, body, read = post(path, total=100 * 1024 * 1024, declared=False)
    assert start["status"] == 413
    assert read == LIMIT // CHUNK + 1  # the chunk that passed the limit, and nothing after it
    assert json.loads(body)["errors"][0]["path"] == ""


@pytest.mark.django_db(transaction=True)
def test_a_body_within_the_limit_reaches_django():
    start, _, read = post("/no/such/path/", total=LIMIT, declared=False)
    assert start["status"] == 404 and read == LIMIT // CHUNK
