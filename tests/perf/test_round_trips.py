"""The round trips to PostgreSQL a step costs are bounded (docs/benchmark.md, "Round trips per
step"): a statement added to the step path, or a write that waits for its answer where it need
not (the fast store's `held_writes`), fails here.

The same chain as tests/perf/test_query_count.py, driven through `step_execute` with real
transactions, with statements not logged (logging them sends every write at once); the round
trips are counted from libpq's protocol trace, as the bench counts them (bench/inprocess.py).
Chains are run first until the driver has prepared the step's statements
(`STEPWISE_DB_PREPARE_AFTER`), as on a worker that has run a few steps: preparing one costs a
round trip of its own, once.
"""
import time

import pytest
from django.db import connection

from bench.inprocess import round_trips
from orchestrator.engine.services.kinds.worker import Carry, step_execute
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from tests.factories import SETUP
from tests.perf.test_query_count import chain_definition, steps_within_a_second  # noqa: F401

pytestmark = [
    pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("without_workers"),
    pytest.mark.skipif("connection.vendor != 'postgresql'",
                       reason="round trips are counted with libpq's trace (PostgreSQL)"),
    pytest.mark.fast_store,  # the fast store's pipelining is what is counted
]

# BEGIN with the step and its run (one pipeline: the transaction's BEGIN goes with its first
# statement, `store.fast.compiled._begin_behind`); its attempt, the step and the `step.running` event
# (one pipeline); the event's ledger entry with the COMMIT (`store.fast.compiled.commit_behind`). Then
# BEGIN with the run locked and its steps (one pipeline); the step, its attempt, the next
# step and the events (one pipeline); their ledger entries with the COMMIT.
STEP = 6
# BEGIN with the run locked and its steps; the step, its attempt, the next step's attempt, the
# next step and the events; their ledger entries with the COMMIT.
CARRIED_STEP = 3


@pytest.fixture(autouse=True)
def fresh_connection():
    """A connection of this test's own: the driver's prepared statements are a per-connection
    cache of bounded size, and what earlier tests sent on a shared one would evict and
    prepare again the step's statements while their round trips are counted."""
    connection.close()
    yield


def chain_steps(version) -> list[int]:
    return list(run_start(version=version, input={}, actor=SETUP).steps.order_by(
        "position").values_list("id", flat=True))


def test_a_step_claimed_from_its_message_stays_within_its_round_trips(team):
    version, _ = workflow_save(team=team, definition=chain_definition(3), actor=SETUP)
    for _ in range(3):  # the statements prepared
        for step_id in chain_steps(version):
            step_execute(step_id=step_id, worker="w")
    first, middle, _ = chain_steps(version)
    step_execute(step_id=first, worker="w")

    trips, _ = round_trips(lambda: step_execute(step_id=middle, worker="w"))

    assert trips <= STEP, f"a step: {trips} round trips, bound {STEP}"


def test_a_carried_step_stays_within_its_round_trips(team):
    def whole_chain(steps: int) -> int:
        version, _ = workflow_save(team=team, definition={**chain_definition(steps),
                                                          "name": f"chain-{steps}"}, actor=SETUP)
        carried = lambda: step_execute(  # noqa: E731
            step_id=chain_steps(version)[0], worker="w", carry=Carry("tools", steps, time.monotonic() + 600))
        for _ in range(3):
            carried()  # the statements prepared, the definition cached
        trips, _ = round_trips(carried)
        return trips

    shorter, longer = whole_chain(3), whole_chain(4)
    carried = longer - shorter

    assert carried <= CARRIED_STEP, f"a carried step: {carried} round trips, bound {CARRIED_STEP}"
    assert connection.vendor == "postgresql"
