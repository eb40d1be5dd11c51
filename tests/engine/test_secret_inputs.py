"""Secrets stay secret (issue 10, part 5).

The attack: a token passed in a run's input and used in an `http.request` header was stored in
clear in the run input, step input and output, event payload and effect result, and shown to the
whole team. Now a value the input schema marks `writeOnly` (or whose key names a secret) reaches
the tool at call time and nowhere else: not the database, the API, the admin or the logs.
"""
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import connection
from django.test import Client

from orchestrator.engine.secret_inputs import MASK, Revealed, secret_paths, split
from orchestrator.engine.services.kinds.worker import step_execute
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.engine.states import RunState
from orchestrator.models import Effect, Run, RunSecret, StepRun
from tests.conftest import client_for
from tests.factories import SETUP, UserFactory

TOKEN = "tok-5f3c9a1e7d2b4c68"


class EchoServer:
    """A local HTTP API that records what it was sent and, like a careless API, echoes the
    request's headers and body back in its answer."""

    def __init__(self):
        self.received: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                server.received.append({"headers": dict(self.headers), "body": body})
                data = json.dumps({"you_sent": dict(self.headers), "body": body}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.http.shutdown()
        self.http.server_close()


def calling(url: str) -> dict:
    return {
        "name": "call-api",
        "input_schema": {"type": "object", "required": ["access_code", "customer"], "properties": {
            "access_code": {"type": "string", "writeOnly": True},
            "customer": {"type": "string"}}},
        "steps": [
            {"name": "call", "type": "tool", "tool": "http.request", "side_effect": True,
             "params": {"method": "POST", "url": f"{url}/orders",
                        "headers": {"X-Client": "{{ input.access_code }}"},
                        "json": {"customer": "{{ input.customer }}",
                                 "note": "sent with {{ input.access_code }}"}}},
            {"name": "report", "type": "tool", "tool": "core.echo", "after": ["call"],
             "params": {"answer": "{{ steps.call.output.body }}"}},
        ],
    }


def drive(run: Run) -> Run:
    """Run queued steps in this process, as a worker would, until the run stops running."""
    deadline = time.monotonic() + 30
    while (run := Run.objects.get(pk=run.pk)).state == RunState.RUNNING:
        assert time.monotonic() < deadline, f"run {run.id} still running"
        if step := run.steps.filter(state="queued").first():
            step_execute(step_id=step.id, worker="test")
        else:
            time.sleep(0.05)
    return run


def every_text_in_the_database() -> str:
    chunks = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            cursor.execute(f'SELECT * FROM "{table}"')
            chunks.extend(repr(row) for row in cursor.fetchall())
    return "\n".join(chunks)


@pytest.mark.django_db(transaction=True)
def test_a_secret_input_reaches_the_tool_and_nothing_else(team, requester, caplog):
    caplog.set_level(logging.DEBUG)
    api = client_for(requester)
    with EchoServer() as server:
        workflow_save(team=team, definition=calling(server.url), actor=SETUP)
        started = api.post("/api/v1/workflows/call-api/runs/",
                           {"input": {"access_code": TOKEN, "customer": "c-1"}}, format="json")
        assert started.status_code == 202, started.json()
        run = drive(Run.objects.get(pk=started.json()["id"]))
    assert run.state == RunState.COMPLETED, run.error

    # The tool got it, at call time: in the header and in the rendered body.
    (request,) = server.received
    assert request["headers"]["X-Client"] == TOKEN
    assert json.loads(request["body"]) == {"customer": "c-1", "note": f"sent with {TOKEN}"}

    # Stored: a marker where it was, the value sealed, the echo masked.
    assert run.input == {"access_code": {"secret": "input.access_code"}, "customer": "c-1"}
    assert RunSecret.objects.filter(run=run).exists()
    call = StepRun.objects.get(run=run, name="call")
    assert call.output["body"]["you_sent"]["X-Client"] == MASK
    assert Effect.objects.get(step=call).result["body"]["you_sent"]["X-Client"] == MASK

    # Nowhere in the database: every table, every column (events, effects, the ledger, ...).
    assert TOKEN not in every_text_in_the_database()

    # Nowhere the API shows.
    for path in (f"/api/v1/runs/{run.id}/", "/api/v1/runs/"):
        response = api.get(path)
        assert response.status_code == 200, path
        assert TOKEN not in response.content.decode(), path
    assert api.get(f"/api/v1/runs/{run.id}/").json()["input"]["access_code"] == {
        "secret": "input.access_code"}

    # Nowhere the admin shows, even to a superuser.
    admin = Client()
    admin.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    pages = [f"/admin/orchestrator/run/{run.id}/change/", "/admin/orchestrator/run/",
             f"/admin/orchestrator/steprun/{call.id}/change/", "/admin/orchestrator/event/",
             "/admin/orchestrator/effect/",
             f"/admin/orchestrator/effect/{Effect.objects.get(step=call).pk}/change/",
             "/admin/audit/auditentry/"]
    for page in pages:
        response = admin.get(page)
        assert response.status_code == 200, page
        assert TOKEN not in response.content.decode(), page

    # Nowhere in the logs.
    assert TOKEN not in caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_failing_call_does_not_store_the_secret_in_its_error(team, requester):
    definition = calling("http://127.0.0.1:9")  # nothing listens: the call fails
    definition["steps"][0]["params"]["url"] = "http://127.0.0.1:9/{{ input.access_code }}"
    definition["steps"][0]["retry"] = {"max_attempts": 1}
    version, _ = workflow_save(team=team, definition=definition, actor=SETUP)
    run = drive(run_start(version=version, input={"access_code": TOKEN, "customer": "c"},
                          actor=requester))
    assert run.state == RunState.FAILED
    assert TOKEN not in every_text_in_the_database()


@pytest.mark.django_db
def test_a_replay_with_the_same_secret_is_the_same_run_and_another_secret_conflicts(team, requester):
    version, _ = workflow_save(team=team, definition=calling("http://127.0.0.1:9"), actor=SETUP)
    first = run_start(version=version, input={"access_code": TOKEN, "customer": "c"},
                      actor=requester, idempotency_key="k")
    again = run_start(version=version, input={"access_code": TOKEN, "customer": "c"},
                      actor=requester, idempotency_key="k")
    assert again.pk == first.pk and not again._created
    from orchestrator.engine.errors import IdempotencyConflict
    with pytest.raises(IdempotencyConflict):
        run_start(version=version, input={"access_code": "another", "customer": "c"},
                  actor=requester, idempotency_key="k")


@pytest.mark.parametrize("schema, value, paths", [
    ({"properties": {"pin": {"type": "string", "writeOnly": True}}}, {"pin": "1234", "a": "x"},
     [("pin",)]),
    ({}, {"auth": {"access_token": "t", "user": "u"}, "password": "p"},
     [("auth", "access_token"), ("password",)]),
    ({"properties": {"keys": {"items": {"writeOnly": True}}}}, {"keys": ["k1", "k2"]},
     [("keys", "0"), ("keys", "1")]),
    ({"properties": {"credentials": {"writeOnly": True}}}, {"credentials": {"token": "t"}},
     [("credentials",)]),
    ({}, {"tokens_in": 3, "customer_email": "a@example.com"}, []),
])
def test_which_inputs_are_secret(schema, value, paths):
    assert secret_paths(schema, value) == paths


def test_a_marker_is_revealed_for_the_call_and_the_value_scrubbed_from_what_comes_back():
    masked, secrets = split({}, {"api_key": "k-123456", "q": "x"})
    assert masked == {"api_key": {"secret": "input.api_key"}, "q": "x"}
    revealed = Revealed(secrets)
    assert revealed.reveal({"input": masked}) == {"input": {"api_key": "k-123456", "q": "x"}}
    assert revealed.scrub({"echo": "Bearer k-123456!", "n": ["k-123456"]}) == {
        "echo": f"Bearer {MASK}!", "n": [MASK]}


@pytest.mark.django_db
def test_rotating_the_key_reseals_the_secrets_of_runs(team, requester, settings):
    from io import StringIO

    from django.core.management import call_command

    from orchestrator.engine.secret_inputs import revealed_for

    version, _ = workflow_save(team=team, definition=calling("http://127.0.0.1:9"), actor=SETUP)
    run = run_start(version=version, input={"access_code": TOKEN, "customer": "c"}, actor=requester)
    old = settings.STEPWISE_TRIGGER_KEY
    settings.STEPWISE_TRIGGER_KEY, settings.STEPWISE_TRIGGER_KEY_FALLBACKS = "n" * 48, [old]
    out = StringIO()
    call_command("stepwise_reseal_triggers", stdout=out)
    assert "resealed the secret inputs of 1 run(s)" in out.getvalue()
    settings.STEPWISE_TRIGGER_KEY_FALLBACKS = []  # the old key is gone: the new one opens them
    assert revealed_for(run.id).values == {"input.access_code": TOKEN}


def test_a_webhook_secret_does_not_open_as_a_run_secret(settings):
    from django.core.exceptions import ImproperlyConfigured

    from orchestrator.engine.sealing import RUN_SECRETS, WEBHOOK_SECRETS

    with pytest.raises(ImproperlyConfigured):
        RUN_SECRETS.unseal(WEBHOOK_SECRETS.seal(TOKEN))


@pytest.mark.django_db
def test_a_refused_input_does_not_quote_the_secret(team, requester):
    from orchestrator.engine.errors import InputInvalid

    definition = calling("http://127.0.0.1:9")
    definition["input_schema"]["properties"]["access_code"]["minLength"] = 40
    version, _ = workflow_save(team=team, definition=definition, actor=SETUP)
    with pytest.raises(InputInvalid) as refused:
        run_start(version=version, input={"access_code": TOKEN, "customer": "c"}, actor=requester)
    assert refused.value.problems == [{"path": "input.access_code", "message":
                                       "the secret value fails 'minLength' of its schema"}]
