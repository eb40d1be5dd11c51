"""The live pages' tests: the real web server and workers of the browser tests, and a way to
drive async code from a test."""
import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest
from asgiref.sync import async_to_sync

from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role
from tests.browser.conftest import web_server  # noqa: F401
from tests.factories import SETUP, member


def run_async(fn, *args, **kwargs):
    """Run the async function `fn` to completion from a (sync) test.

    In a thread of its own when this one already runs an event loop: Playwright's sync API keeps
    one running for as long as the browser tests' session-scoped browser is open, and a test
    process may run those tests first.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return async_to_sync(fn)(*args, **kwargs)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(async_to_sync(fn), *args, **kwargs).result()


# A run of this workflow waits at its first step (a gate) from the transaction that starts it:
# it sends no work, so these tests see only the events they cause, even in a session where the
# browser tests' real workers are running.
GATED = {
    "name": "gated",
    "input_schema": {"type": "object"},
    "steps": [
        {"name": "hold", "type": "human_gate", "approvers": "support_leads", "timeout_s": 3600,
         "instructions": "Let the run go on."},
        {"name": "after", "type": "tool", "tool": "core.echo", "after": ["hold"], "params": {}},
    ],
}


@pytest.fixture
def version(team):
    """The first version of GATED, saved for the test's team."""
    return workflow_save(team=team, definition=GATED, actor=SETUP)[0]


@pytest.fixture
def starter(team):
    return member(team, "starter", role=Role.EDITOR)
