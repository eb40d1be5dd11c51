"""The web server's PostgreSQL connection pool (settings.py, orchestrator/asgi.py).

Under ASGI each request runs in a thread of its own, so without a pool every request opened a
PostgreSQL connection and closed it. These tests start the web process as `make run` does and
count, on the server, the sessions opened while it answers.
"""
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from django.db import connection

from tests.support import live_server
from tests.support.live_server import LiveServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

REQUESTS = 48
CLIENTS = 8
POOL = 4  # STEPWISE_DB_POOL given to the server below


@pytest.fixture
def postgres():
    if connection.vendor != "postgresql":
        pytest.skip("the pool is PostgreSQL's (the embedded default's SQLite has no server)")


def _sessions_opened() -> int:
    """Sessions ever opened on this test database, as the server counts them."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]


def _settled_sessions(before: int) -> int:
    """Sessions opened since `before`, once the server's statistics stopped moving (a backend
    reports its session when it ends, or within a second or so while it lives)."""
    last, stable_since = None, time.monotonic()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        now = _sessions_opened() - before
        if now != last:
            last, stable_since = now, time.monotonic()
        elif time.monotonic() - stable_since > 2:
            break
        time.sleep(0.25)
    return last


def _hammer(url: str) -> list[int]:
    """REQUESTS readiness checks (each runs `SELECT 1` on the database) from CLIENTS threads."""
    def one(_):
        return httpx.get(f"{url}/api/v1/health/ready/", timeout=30).status_code

    with ThreadPoolExecutor(CLIENTS) as pool:
        return list(pool.map(one, range(REQUESTS)))


APP = "stepwise-pool-test"  # the server's connections name themselves, to be told apart


def _serve(monkeypatch, pool_size: str, name: str) -> LiveServer:
    """The web process, its connections marked with APP (other processes of the session, its
    Celery workers, the browser tests' server, use the same database)."""
    monkeypatch.setenv("STEPWISE_DB_POOL", pool_size)
    env = live_server.server_env
    monkeypatch.setattr(live_server, "server_env", lambda: {
        **env(), "DATABASE_URL": f"{env()['DATABASE_URL']}?application_name={APP}"})
    return LiveServer(name).start()


def _second_round(monkeypatch, pool_size: str, name: str):
    """Serve with `pool_size`, hammer twice (the first round warms whatever the server keeps),
    and return the second round's statuses, the sessions it opened, the server's connections
    open right after it, and the (stopped) server for its log."""
    server = _serve(monkeypatch, pool_size, name)
    try:
        _hammer(server.url)
        before = _sessions_opened()
        statuses = _hammer(server.url)
        return statuses, _settled_sessions(before), _open_connections(), server
    finally:
        server.stop()


def test_the_web_server_answers_concurrent_requests_from_a_bounded_pool(postgres, monkeypatch):
    statuses, opened, held, server = _second_round(monkeypatch, str(POOL), "pool")
    assert statuses == [200] * REQUESTS, server.errors_logged()
    # Every request of the second round was answered on a connection the pool already held
    # (the count is the database's: another process of the session may have opened one or two).
    assert opened <= 3, f"{opened} sessions opened for {REQUESTS} requests with a warm pool"
    assert 1 <= held <= POOL  # the pool's connections, kept open between requests


def _open_connections() -> int:
    """The web process's connections to this test database now."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                       " AND application_name = %s", [APP])
        return cursor.fetchone()[0]


def test_without_the_pool_every_request_opens_a_connection_and_closes_it(postgres, monkeypatch):
    """The control: what the pool removes (STEPWISE_DB_POOL=0 turns it off). Each request's
    connection is closed after it: kept open, one per request thread, they piled up until
    PostgreSQL refused new clients (16 clients x 400 requests: a quarter of them were 500s)."""
    statuses, opened, left_open, server = _second_round(monkeypatch, "0", "nopool")
    assert statuses == [200] * REQUESTS, server.errors_logged()
    assert opened >= REQUESTS
    assert left_open == 0, f"{left_open} connections left open by {2 * REQUESTS} requests"


def test_long_polls_hold_no_pooled_connection_while_they_wait(postgres, monkeypatch, team):
    """Four long-polls at once on a pool of two: each gives its connection back between reads,
    so none waits for a connection (a request that waited over a second would be a 500)."""
    from rest_framework.authtoken.models import Token

    from orchestrator.engine.services.runs import run_start
    from orchestrator.engine.services.workflows import workflow_save
    from orchestrator.web.progress import latest_event_of
    from tests.factories import SETUP, example_definition, member

    version, _ = workflow_save(team=team, definition=example_definition("support"), actor=SETUP)
    run = run_start(version=version, actor=SETUP, input={
        "ticket_id": "T-1", "body": "Please refund my invoice", "customer_email": "c@example.com"})
    token = Token.objects.create(user=member(team, "watcher")).key
    monkeypatch.setenv("STEPWISE_DB_POOL_TIMEOUT_S", "1")
    server = _serve(monkeypatch, "2", "longpoll")
    url = f"{server.url}/api/v1/runs/{run.id}/?wait_for_change={latest_event_of(run)}&timeout=3"

    def poll(_):
        started = time.monotonic()
        answer = httpx.get(url, headers={"Authorization": f"Token {token}"}, timeout=30)
        return answer.status_code, time.monotonic() - started

    try:
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(poll, range(4)))
    finally:
        server.stop()
    assert [status for status, _ in answers] == [200] * 4, server.errors_logged()
    assert all(waited >= 2.9 for _, waited in answers)  # each really waited for a change


def test_the_pool_replaces_connections_the_database_dropped(postgres, monkeypatch):
    """The database ends every connection of the web process (a restart, a failover, an idle
    timeout): the next requests are answered, each on a connection checked as it is handed out."""
    server = _serve(monkeypatch, str(POOL), "dropped")
    try:
        _hammer(server.url)  # the pool holds connections now
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                           " WHERE datname = current_database() AND application_name = %s", [APP])
            dropped = cursor.fetchone()[0]
        statuses = _hammer(server.url)
    finally:
        server.stop()
    assert dropped >= 1
    assert statuses == [200] * REQUESTS, server.errors_logged()
