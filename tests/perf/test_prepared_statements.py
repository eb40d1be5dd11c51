"""On PostgreSQL the statements every step sends are prepared once per connection.

The engine sends the same few statements for every step; PostgreSQL parsing and planning each
of them anew cost about a third of a step's time in the database (docs/benchmark.md). psycopg
prepares a statement after it has run `STEPWISE_DB_PREPARE_AFTER` times on a connection (the
values bound on the server); `off` keeps Django's default, every statement text with its
values inlined, for a pooler that cannot hold prepared statements.
"""
import json
import os
import subprocess
import sys
import time

import pytest
from django.db import connection

from orchestrator.engine.services.kinds.worker import Carry, step_execute
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from tests.factories import SETUP
from tests.perf.test_query_count import chain_definition

# The fast store's statements are what is counted here.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("without_workers"),
              pytest.mark.fast_store]


def test_a_chains_step_statements_are_prepared_on_the_server(team):
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's (run with DATABASE_URL set)")
    version, _ = workflow_save(team=team, definition=chain_definition(10), actor=SETUP)
    run = run_start(version=version, input={}, actor=SETUP)
    first = run.steps.order_by("position").values_list("id", flat=True)[0]

    step_execute(step_id=first, worker="w", carry=Carry("tools", 10, time.monotonic() + 600))

    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    assert run.steps.filter(state="completed").count() == 10
    for statement in ('UPDATE "orchestrator_steprun" SET', 'INSERT INTO "orchestrator_event"',
                      'INSERT INTO "audit_entry"', 'INSERT INTO "orchestrator_stepattempt"',
                      'SELECT "orchestrator_run"."id"'):
        assert any(p.startswith(statement) for p in prepared), (statement, prepared)


def database_options(prepare_after: str | None) -> dict:
    """The OPTIONS the settings give PostgreSQL with STEPWISE_DB_PREPARE_AFTER set so (None:
    unset), read in a fresh interpreter (settings are read once, at import)."""
    env = {**os.environ, "DATABASE_URL": "postgres://stepwise@db.invalid:5432/stepwise"}
    env.pop("STEPWISE_DB_PREPARE_AFTER", None)
    if prepare_after is not None:
        env["STEPWISE_DB_PREPARE_AFTER"] = prepare_after
    code = ("import json, orchestrator.settings as s; "
            "print(json.dumps(s.DATABASES['default'].get('OPTIONS', {})))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_statements_are_prepared_after_five_runs_unless_turned_off():
    assert database_options(None) == {"server_side_binding": True, "prepare_threshold": 5}
    assert database_options("0") == {"server_side_binding": True, "prepare_threshold": 0}
    assert database_options("off") == {}
    assert database_options("sometimes") == {"error": (
        "django.core.exceptions.ImproperlyConfigured: STEPWISE_DB_PREPARE_AFTER must be a number "
        "of runs (0 or more) or off, not 'sometimes'")}
