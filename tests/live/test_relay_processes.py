"""The relay across real processes: a real worker process commits a run's steps, the real web
process (uvicorn, as `make run`) relays the outbox, and a websocket client here gets the nudge.

On the embedded default (SQLite, filesystem broker, in-memory channel layer) nothing but the
database connects the worker and the web process: this is what the relay is for. With
DATABASE_URL / REDIS_URL set, the same test runs on PostgreSQL (LISTEN/NOTIFY) and Redis.
"""
import json

import pytest
from websockets.sync.client import connect

from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, Role
from tests.factories import SETUP, member
from tests.integration.conftest import wait_for_run

from .test_consumers import session_cookie

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ECHOES = {
    "name": "echoes",
    "input_schema": {"type": "object"},
    "steps": [
        {"name": "one", "type": "tool", "tool": "core.echo", "params": {"n": 1}},
        {"name": "two", "type": "tool", "tool": "core.echo", "after": ["one"], "params": {"n": 2}},
    ],
}


def test_a_step_a_worker_commits_reaches_a_websocket_of_the_web_process(workers, web_server, team):
    starter = member(team, "starter", role=Role.EDITOR)
    version, _ = workflow_save(team=team, definition=ECHOES, actor=SETUP)
    host = web_server.removeprefix("http://")
    with connect(f"ws://{host}/ws/runs/", origin=web_server,
                 additional_headers={"Cookie": session_cookie(starter)}, open_timeout=10) as socket:
        hello = json.loads(socket.recv(timeout=10))
        assert hello["type"] == "changed"
        run = run_start(version=version, input={}, actor=starter)
        finished = wait_for_run(run.id, states=("completed", "failed"))
        assert finished.state == "completed"
        last = Event.objects.filter(run=run).order_by("-id").first()
        assert last.kind == "run.completed" and last.actor.startswith("worker:")  # another process wrote it
        seen = []
        while not seen or seen[-1]["event"] < last.id:
            seen.append(json.loads(socket.recv(timeout=15)))
        assert seen[-1] == {"type": "changed", "run": str(run.id), "event": last.id}
