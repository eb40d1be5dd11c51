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


@pytest.fixture
def version(team):
    version, _ = workflow_save(team=team, definition={
        "name": "threads", "input_schema": {"type": "object"},
        "steps": [{"name": "a", "type": "tool", "tool": "core.echo"}]}, actor=SETUP)
    return version


def serve(version, used: list[weakref.ref]) -> None:
    """What a request's thread does: the run started, its ledger entries written, then Django's
    `request_finished` closing the thread's connections."""
    def request() -> None:
        run_start(version=version, input={}, actor=SETUP)
        used.append(weakref.ref(connections["default"]))
        connections.close_all()

    thread = threading.Thread(target=request)
    thread.start()
    thread.join()


def test_the_connection_of_a_thread_that_started_a_run_is_freed_with_the_thread(version):
    used: list[weakref.ref] = []
    for _ in range(3):
        serve(version, used)
    gc.collect()
    assert [ref() for ref in used] == [None, None, None]


@pytest.mark.fast_store
def test_a_thread_reads_and_writes_with_what_an_earlier_threads_connection_compiled(version, monkeypatch):
    """Plans outlive the connection they were compiled on, or every request would compile its
    reads and prepare its fields' writers again."""
    from orchestrator.store.fast import compiled

    made = []

    def counted(owner, name: str) -> None:
        original = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda *args: made.append(name) or original(*args))

    counted(compiled.CompiledRead, "_compile")
    counted(compiled, "_preparer")
    used: list[weakref.ref] = []
    serve(version, used)
    first = len(made)
    serve(version, used)
    serve(version, used)
    assert len(made) == first
