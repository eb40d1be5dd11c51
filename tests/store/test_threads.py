"""A database connection belongs to its thread. Django makes one per thread (under ASGI, one per
request), so nothing the store keeps for a connection may outlive the thread: a web process
would keep every request's connection object and its cursors, and the collector's full passes
over them would stall requests."""
import gc
import threading
import weakref

import pytest
from django.db import connections

from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from tests.factories import SETUP

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("without_workers")]


def test_the_connection_of_a_thread_that_started_a_run_is_freed_with_the_thread(team):
    version, _ = workflow_save(team=team, definition={
        "name": "threads", "input_schema": {"type": "object"},
        "steps": [{"name": "a", "type": "tool", "tool": "core.echo"}]}, actor=SETUP)
    used: list[weakref.ref] = []

    def serve() -> None:
        # What a request's thread does: the run started, its ledger entries written, then
        # Django's `request_finished` closing the thread's connections.
        run_start(version=version, input={}, actor=SETUP)
        used.append(weakref.ref(connections["default"]))
        connections.close_all()

    for _ in range(3):
        thread = threading.Thread(target=serve)
        thread.start()
        thread.join()
    gc.collect()
    assert [ref() for ref in used] == [None, None, None]
