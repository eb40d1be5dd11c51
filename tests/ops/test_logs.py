"""Log lines: the ids on every line, the engine's failures logged once at their level, JSON in
production, and never a secret.

The lines are read through the handler the settings' LOGGING builds (its filters and
formatter), as a worker or the web process writes them.
"""
import io
import json
import logging
import os
import subprocess
import sys
from logging.config import dictConfig

import pytest
from django.conf import settings
from django.utils.log import DEFAULT_LOGGING

from orchestrator.engine.retry import StepError
from orchestrator.engine.services.kinds.worker import Usage, step_claim, step_fail, step_retry_due
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.operations.logcontext import bound
from orchestrator.signals import enter_task_context, leave_task_context
from tests.conftest import client_for
from tests.factories import SETUP

SECRET = "sk-live0123456789abcdefXYZ"


@pytest.fixture
def lines(settings):
    """What the configured console handler writes, as a list of lines (JSON format)."""
    stream = io.StringIO()
    config = settings.LOGGING
    handler = logging.StreamHandler(stream)
    for name in config["handlers"]["console"]["filters"]:
        spec = dict(config["filters"][name])
        handler.addFilter(_build(spec))
    handler.setFormatter(_build(dict(config["formatters"]["json"])))
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    root.removeHandler(handler)
    root.setLevel(level)


def _build(spec: dict):
    factory = spec.pop("()")
    module, name = factory.rsplit(".", 1)
    return getattr(__import__(module, fromlist=[name]), name)(**spec)


def fail_twice(team):
    version, _ = workflow_save(team=team, definition={
        "name": "fragile", "input_schema": {"type": "object"}, "steps": [
            {"name": "call", "type": "tool", "tool": "core.echo",
             "retry": {"max_attempts": 2, "base_s": 60, "jitter": False}}]}, actor=SETUP)
    run = run_start(version=version, input={}, actor=SETUP)
    step = run.steps.get(name="call")
    claim = step_claim(step_id=step.id, worker="test")
    step_fail(step_id=step.id, attempt=claim.attempt,
              error=StepError("transient", f"upstream said 503 (key {SECRET})"), usage=Usage(),
              worker="test")
    return run, step


@pytest.mark.django_db
def test_a_failing_step_logs_its_retry_failure_dead_letter_and_the_run_once_each(
        team, lines, django_capture_on_commit_callbacks, move_clock):
    with django_capture_on_commit_callbacks(execute=True):
        run, step = fail_twice(team)
    move_clock(61)
    with django_capture_on_commit_callbacks(execute=True):
        step_retry_due(step_id=step.id)
        claim = step_claim(step_id=step.id, worker="test")
        step_fail(step_id=step.id, attempt=claim.attempt,
                  error=StepError("transient", "upstream said 503 again"), usage=Usage(),
                  worker="test")
    engine = [(line["event"], line["level"], line["attempt"]) for line in lines()
              if line["logger"] == "stepwise.events" and line["level"] != "info"]
    assert engine == [("step.retrying", "warning", "1"), ("step.failed", "error", "2"),
                      ("step.dead_lettered", "error", "2"), ("run.failed", "error", None)]
    for line in lines():
        if line["logger"] == "stepwise.events":
            assert (line["run_id"], line["workflow"], line["team"]) == (str(run.id), "fragile",
                                                                        "support")
    text = json.dumps(lines())
    assert SECRET not in text and "upstream said 503 (key ***)" in text


@pytest.mark.django_db
def test_a_rolled_back_change_logs_nothing(team, lines, django_capture_on_commit_callbacks):
    from django.db import transaction

    with django_capture_on_commit_callbacks(execute=True):
        with pytest.raises(RuntimeError), transaction.atomic():
            fail_twice(team)
            raise RuntimeError("rolled back")
    assert [line for line in lines() if line["logger"] == "stepwise.events"] == []


def test_secrets_never_reach_a_line_in_message_arguments_extras_or_tracebacks(lines):
    log = logging.getLogger("stepwise.test")
    log.warning("calling with Authorization: Bearer %s", "abcdefghijklmnopqrstuvwxyz")
    log.warning("connection", extra={"password": "hunter22", "params": {"api_key": "k-123456",
                                                                        "city": "Oslo"}})
    try:
        raise ValueError(f"token {SECRET} refused")
    except ValueError:
        log.exception("call failed")
    written = lines()
    text = json.dumps(written)
    for secret in ("abcdefghijklmnopqrstuvwxyz", "hunter22", "k-123456", SECRET):
        assert secret not in text
    assert written[1]["params"] == {"api_key": "***", "city": "Oslo"}
    assert "token *** refused" in written[2]["error"]


def test_every_line_carries_the_bound_ids(lines):
    with bound(run_id="r-1", step="draft", attempt=2, workflow="support-reply", team="support",
               trace_id="ab" * 16):
        logging.getLogger("anything.at.all").info("hello")
    [line] = lines()
    assert {k: line[k] for k in ("run_id", "step", "attempt", "workflow", "team", "trace_id")} == {
        "run_id": "r-1", "step": "draft", "attempt": "2", "workflow": "support-reply",
        "team": "support", "trace_id": "ab" * 16}


def test_a_task_logs_with_the_run_and_step_its_message_names_and_forgets_them_after(lines):
    class Request:
        stepwise_run, stepwise_step = "run-7", "classify"
        traceparent = "00-" + "cd" * 16 + "-" + "12" * 8 + "-01"

    class Task:
        name, request = "orchestrator.tasks.execute_step", Request()

    enter_task_context(task=Task())
    logging.getLogger("celery.task").info("working")
    leave_task_context(task=Task())
    logging.getLogger("celery.task").info("idle")
    working, idle = lines()
    assert (working["run_id"], working["step"], working["trace_id"]) == ("run-7", "classify",
                                                                         "cd" * 16)
    assert (idle["run_id"], idle["step"], idle["trace_id"]) == (None, None, None)


@pytest.mark.django_db
def test_a_request_warning_is_written_once_with_the_requests_trace_id(lines, requester):
    response = client_for(requester).get("/api/v1/runs/00000000-0000-0000-0000-000000000000/")
    warnings = [line for line in lines() if line["logger"] == "django.request"]
    assert len(warnings) == 1 and warnings[0]["trace_id"] == response["X-Trace-Id"]
    assert warnings[0]["run_id"] == "00000000-0000-0000-0000-000000000000"


def test_djangos_own_console_handler_is_gone_so_debug_warnings_print_once(settings):
    dictConfig(DEFAULT_LOGGING)  # what Django installs before the settings' LOGGING
    dictConfig(settings.LOGGING)
    assert logging.getLogger("django").handlers == []
    assert len(logging.getLogger().handlers) >= 1


def test_development_writes_text_and_json_is_one_setting_away():
    assert settings.STEPWISE_LOG_FORMAT == "text"  # the test settings are development's
    out = subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); from django.conf import settings;"
         " print(settings.LOGGING['handlers']['console']['formatter'])"],
        env={**os.environ, "STEPWISE_LOG_FORMAT": "json"},
        capture_output=True, text=True, check=True).stdout.strip()
    assert out.splitlines()[-1] == "json"


@pytest.mark.django_db
def test_an_event_line_names_its_own_run_and_step_not_those_bound_before(
        team, lines, django_capture_on_commit_callbacks):
    with bound(run_id="another-run", step="stale", attempt=9, trace_id="ef" * 16), \
            django_capture_on_commit_callbacks(execute=True):
        run, _ = fail_twice(team)
    [retrying] = [line for line in lines() if line.get("event") == "step.retrying"]
    assert (retrying["run_id"], retrying["step"], retrying["attempt"]) == (str(run.id), "call", "1")
    assert retrying["trace_id"] == "ef" * 16  # the trace it happened in is kept
    created = [line for line in lines() if line.get("event") == "run.created"]
    assert created and (created[0]["step"], created[0]["attempt"]) == (None, None)


# Each process kind sets its logging up its own way before anything logs: uvicorn installs
# handlers of its own and then imports the app (Django's setup); a Celery worker and beat
# configure through Celery's setup_logging signal; the event consumer through manage.py.
PROCESS_SETUP = {
    "web": "import uvicorn.config; uvicorn.config.Config('orchestrator.asgi:application')"
           ".configure_logging(); import orchestrator.asgi",
    "worker": "from celery.apps.worker import Worker; from orchestrator.celery import app; "
              "import django; django.setup(); Worker(app=app, loglevel='INFO').setup_logging()",
    "beat": "from celery.apps.beat import Beat; from orchestrator.celery import app; "
            "import django; django.setup(); Beat(app=app, loglevel='INFO', "
            "redirect_stdouts=False).setup_logging()",
    "consumer": "import django; django.setup()",
}
# A run's secret input, revealed to render a tool's URL, then printed by libraries' loggers:
# httpx's request line (the URL's query), a header list as httpcore writes it, a JSON body,
# and (web) uvicorn's access line through uvicorn's own handler.
LIBRARIES_LOG = """
import json, logging, httpx
from orchestrator.engine.sealing import RUN_SECRETS
from orchestrator.engine.secret_inputs import revealed_from
revealed_from(RUN_SECRETS.seal(json.dumps({"input.api_token": "query-77-opaque"})))
client = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(200)))
client.get("https://api.example.com/orders?customer=acme&key=query-77-opaque")
logging.getLogger("httpcore.http11").warning(
    "send_request_headers.started headers=[(b'Host', b'api.example.com'), "
    "(b'X-Api-Key', b'header-88-opaque')]")
logging.getLogger("some.sdk").warning("response body: %s", '{"id": 7, "password": "body-99-opaque"}')
logging.getLogger("uvicorn.access").info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5000", "GET",
                                         "/hooks/x?token=access-66-opaque", "1.1", 200)
"""


@pytest.mark.parametrize("kind", list(PROCESS_SETUP))
def test_every_process_kind_masks_secrets_in_any_library_s_lines(kind):
    out = subprocess.run([sys.executable, "-c", PROCESS_SETUP[kind] + "\n" + LIBRARIES_LOG],
                         env={**os.environ, "STEPWISE_LOG_LEVEL": "INFO"},
                         capture_output=True, text=True, timeout=120)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "HTTP Request: GET https://api.example.com/orders?customer=acme&key=***" in text, text
    assert "(b'X-Api-Key', b'***')" in text and '"password": "***"' in text, text
    assert "/hooks/x?token=***" in text, text
    for secret in ("query-77-opaque", "header-88-opaque", "body-99-opaque", "access-66-opaque"):
        assert secret not in text, (secret, text)
