"""The SQL a step costs is bounded: adding a statement or a transaction to the step path fails here.

A step of a chain of the pure built-in tool `core.echo` is driven through `step_execute`, the
one call the worker's `execute_step` task makes (claim, execute, succeed and advance the run),
under `CaptureQueriesContext`, with real transactions (`transaction=True`: BEGIN and COMMIT are
sent, and on-commit dispatches happen). The bounds are the numbers in docs/benchmark.md
("SQL statements per step"); when a change lowers a count, lower its bound here and there.
"""
import time
from dataclasses import dataclass
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.db import connection
from django.test.utils import CaptureQueriesContext

from orchestrator.engine import attestation
from orchestrator.engine.services import attestations
from orchestrator.engine.services.kinds.worker import Carry, step_execute
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import WorkerKey
from tests.factories import SETUP

# A worker the session started (an integration test) must not take these steps first.
# The fast store's statements are what is counted here.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("without_workers"),
              pytest.mark.fast_store]

TX_CONTROL = {"BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE"}


@dataclass(frozen=True)
class Bound:
    statements: int  # every statement but transaction control (BEGIN/COMMIT/SAVEPOINT/...)
    transactions: int


# Per backend (connection.vendor). Keep in step with docs/benchmark.md. PostgreSQL's NOTIFY is
# sent by the outbox's INSERT trigger, not as a statement; SQLite reads the chain's head instead.
STEP = {"sqlite": Bound(statements=14, transactions=2), "postgresql": Bound(statements=12, transactions=2)}
CARRIED_STEP = {"sqlite": Bound(statements=9, transactions=1), "postgresql": Bound(statements=8, transactions=1)}
LAST_STEP = {"sqlite": Bound(statements=17, transactions=2), "postgresql": Bound(statements=15, transactions=2)}
# A start counts the team's unfinished runs against its cap (budgets.services.budget_admit:
# the one cap of every start path, STEPWISE_TEAM_MAX_LIVE_RUNS when no limit sets one).
POST_RUN = {"sqlite": 11, "postgresql": 10}
POST_GATED_RUN = {"sqlite": 17, "postgresql": 16}


@pytest.fixture(autouse=True)
def steps_within_a_second(monkeypatch):
    """The counts are of a chain whose steps follow each other within the run's progress
    resolution (`scheduling.PROGRESS_RESOLUTION`), as the bench's do: the run's progress time
    is not written again. However slow the machine, these steps are measured that way."""
    monkeypatch.setattr("orchestrator.engine.services.scheduling.PROGRESS_RESOLUTION",
                        timedelta(days=1))


def chain_definition(steps: int) -> dict:
    """The bench's workflow (bench/measure.py): s0 -> s1 -> ... of `core.echo`."""
    return {"name": "chain", "input_schema": {"type": "object"}, "steps": [
        {"name": f"s{i}", "type": "tool", "tool": "core.echo", "params": {"step": i},
         **({"after": [f"s{i - 1}"]} if i else {})} for i in range(steps)]}


def kind_of(sql: str) -> str:
    return sql.split(None, 1)[0].upper() if sql else "?"


@dataclass
class Counted:
    sql: list[str]

    @property
    def statements(self) -> int:
        return sum(1 for q in self.sql if kind_of(q) not in TX_CONTROL)

    @property
    def transactions(self) -> int:
        # Django sends BEGIN itself on both backends (SQLite: BEGIN IMMEDIATE).
        return sum(1 for q in self.sql if kind_of(q) == "BEGIN")

    def listing(self) -> str:
        return "\n".join(q[:160] for q in self.sql)


def counted(fn) -> tuple[Counted, object]:
    """The statements `fn()` sends on this process's connection, and what it returned."""
    with CaptureQueriesContext(connection) as captured:
        result = fn()
    return Counted([q["sql"] for q in captured.captured_queries]), result


@pytest.fixture
def chain(team):
    version, _ = workflow_save(team=team, definition=chain_definition(3), actor=SETUP)
    run_start(version=version, input={}, actor=SETUP)  # warms the per-process definition cache
    run = run_start(version=version, input={}, actor=SETUP)
    return list(run.steps.order_by("position").values_list("id", flat=True))


def assert_within(measured: Counted, bound: Bound, what: str) -> None:
    assert measured.statements <= bound.statements, (
        f"{what}: {measured.statements} statements, bound {bound.statements}\n{measured.listing()}")
    assert measured.transactions <= bound.transactions, (
        f"{what}: {measured.transactions} transactions, bound {bound.transactions}\n{measured.listing()}")


@pytest.fixture
def key_known(settings):
    """The worker knows the key that signed the outputs it reads, as a running one does: it
    reads a key once per STEPWISE_ATTESTATION_KEY_CACHE_S, and on a loaded machine the read an
    earlier test left may have expired."""
    settings.STEPWISE_ATTESTATION_KEY_CACHE_S = 3600
    attestation.known_key(attestation.process_key().key_id)


def test_a_step_of_a_chain_stays_within_its_statements_and_transactions(chain, key_known):
    first, middle, last = chain
    step_execute(step_id=first, worker="w")

    measured, _ = counted(lambda: step_execute(step_id=middle, worker="w"))

    assert_within(measured, STEP[connection.vendor], "a step (claim + execute + succeed + advance)")


def test_a_process_registers_its_key_inside_its_first_step_s_transactions(chain, monkeypatch):
    """A new worker process (a key never registered) opens no transaction of its own for the
    registration: the key is registered with the first output it signs."""
    first, middle, last = chain
    # What this process remembers of its key and of others' belongs to the databases of
    # earlier tests: the first step registers its key again here, and the middle step reads it.
    monkeypatch.setattr(attestations, "_registered_in", None)
    attestation.keys_forget()
    step_execute(step_id=first, worker="w")
    fresh = Ed25519PrivateKey.generate()
    monkeypatch.setattr(attestation, "_load_private", lambda: (fresh, "generated"))
    monkeypatch.setattr(attestation, "_process_key", None)
    monkeypatch.setattr(attestations, "_registered_in", None)

    measured, _ = counted(lambda: step_execute(step_id=middle, worker="w"))

    assert WorkerKey.objects.filter(key_id=attestation.process_key().key_id).exists()
    bound = STEP[connection.vendor]
    assert measured.transactions <= bound.transactions, (
        f"a process's first step: {measured.transactions} transactions, bound "
        f"{bound.transactions}\n{measured.listing()}")


def test_a_carried_step_of_a_chain_stays_within_its_statements_and_transactions(team, key_known):
    """A step claimed by the worker whose success started it (worker.Carry): what one more
    step adds to a chain run from its first message."""
    def whole_chain(steps: int) -> Counted:
        version, _ = workflow_save(team=team, definition={**chain_definition(steps),
                                                          "name": f"chain-{steps}"}, actor=SETUP)
        run_start(version=version, input={}, actor=SETUP)  # warms the definition cache
        run = run_start(version=version, input={}, actor=SETUP)
        first = run.steps.order_by("position").values_list("id", flat=True)[0]
        measured, _ = counted(lambda: step_execute(
            step_id=first, worker="w", carry=Carry("tools", steps, time.monotonic() + 600)))
        return measured

    shorter, longer = whole_chain(3), whole_chain(4)
    statements, transactions = (longer.statements - shorter.statements,
                                longer.transactions - shorter.transactions)
    bound = CARRIED_STEP[connection.vendor]

    assert statements <= bound.statements, (
        f"a carried step: {statements} statements, bound {bound.statements}\n{longer.listing()}")
    assert transactions <= bound.transactions, (
        f"a carried step: {transactions} transactions, bound {bound.transactions}\n{longer.listing()}")


def test_the_step_that_completes_the_run_stays_within_its_bound(chain, key_known):
    first, middle, last = chain
    step_execute(step_id=first, worker="w")
    step_execute(step_id=middle, worker="w")

    measured, _ = counted(lambda: step_execute(step_id=last, worker="w"))

    assert_within(measured, LAST_STEP[connection.vendor], "the last step (completes the run)")


def test_starting_a_run_through_the_api_stays_within_its_statements(team, api):
    version, _ = workflow_save(team=team, definition=chain_definition(3), actor=SETUP)
    post = lambda: api.post("/api/v1/workflows/chain/runs/", {"input": {}}, format="json")  # noqa: E731
    assert post().status_code == 202  # the token, the definition cache: warm

    measured, response = counted(post)

    assert response.status_code == 202
    assert measured.statements <= POST_RUN[connection.vendor], (
        f"POST .../runs/: {measured.statements} statements, bound {POST_RUN[connection.vendor]}\n"
        f"{measured.listing()}")


def test_starting_a_run_that_waits_at_a_gate_stays_within_its_statements(team, api, approver):
    """The bench's API load: a run whose first step is a human gate. Its events (the run's
    start, the gate's, the approval request, the run waiting) are one INSERT, and their ledger
    entries one more."""
    workflow_save(team=team, definition={
        "name": "gated", "input_schema": {"type": "object"}, "steps": [
            {"name": "gate", "type": "human_gate", "approvers": "support_leads", "timeout_s": 3600},
            {"name": "after", "type": "tool", "tool": "core.echo", "after": ["gate"]}]}, actor=SETUP)
    post = lambda: api.post("/api/v1/workflows/gated/runs/", {"input": {}}, format="json")  # noqa: E731
    assert post().status_code == 202

    measured, response = counted(post)

    assert response.status_code == 202
    assert measured.statements <= POST_GATED_RUN[connection.vendor], (
        f"POST .../runs/ (a gate first): {measured.statements} statements, bound "
        f"{POST_GATED_RUN[connection.vendor]}\n{measured.listing()}")
    inserts = [q for q in measured.sql if q.startswith(('INSERT INTO "orchestrator_event"', 'INSERT INTO "audit_entry"'))]
    assert len(inserts) == 2, measured.listing()
