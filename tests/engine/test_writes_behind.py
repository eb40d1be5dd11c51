"""Writes sent behind (`orchestrator.store.fast.compiled.writes_behind`, the fast store's
`held_writes`): the database ends up holding
what answering every write at once leaves, the same errors are raised (at the next statement
that needs an answer, or the block's end), and the writes cost fewer round trips. Reads sent
together (`compiled.read_together`): a run locked and its steps read in one round trip, the
steps as the lock's previous holder left them.

PostgreSQL only (psycopg's pipeline mode); elsewhere the block writes at once, which the last
tests check on every backend.
"""
import threading
from functools import partial

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django_fsm import ConcurrentTransition

from bench.inprocess import round_trips
from orchestrator.engine import selectors
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.engine.states import StepState
from orchestrator.models import Event, Run, StepAttempt, StepRun
from orchestrator.store.fast import save_row
from orchestrator.store.fast.compiled import (
    flush,
    insert_json_rows,
    insert_rows,
    update_rows,
    writes_behind,
)
from tests.factories import SETUP

# The fast store's own statements: with that store only.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.fast_store]
postgresql = pytest.mark.skipif("connection.vendor != 'postgresql'",
                                reason="writes are sent behind on PostgreSQL only (pipeline mode)")


@pytest.fixture
def run(team):
    version, _ = workflow_save(team=team, definition={
        "name": "behind", "input_schema": {"type": "object"}, "steps": [
            {"name": "a", "type": "tool", "tool": "core.echo"},
            {"name": "b", "type": "tool", "tool": "core.echo", "after": ["a"]}]}, actor=SETUP)
    return run_start(version=version, input={}, actor=SETUP)


def first_step(run) -> StepRun:
    return StepRun.objects.get(run=run, name="a")


def some_writes(run, step: StepRun) -> StepAttempt:
    """A save, an UPDATE whose count is not read and an INSERT whose key is not read."""
    step.lease_owner = "w1"
    save_row(step, ["lease_owner"])
    update_rows(StepRun, count=False, where={"run": run, "name": "b"}, values={"lease_owner": "w2"})
    attempt = StepAttempt(step=step, number=7, worker="w1", idempotency_key="k")
    insert_rows([attempt], keys=False)
    return attempt


@postgresql
def test_writes_whose_answer_is_not_read_take_one_round_trip_and_land(run):
    step = first_step(run)

    def write(behind: bool) -> StepAttempt:
        with transaction.atomic():
            if not behind:
                return some_writes(run, step)
            with writes_behind():
                attempt = some_writes(run, step)
                assert attempt.pk is None  # its answer is not read yet
            return attempt

    at_once, _ = round_trips(lambda: write(False))
    StepAttempt.objects.filter(number=7).delete()
    sent_behind, attempt = round_trips(lambda: write(True))

    # The first write with its transaction's BEGIN, 2 writes, COMMIT / BEGIN and 3 writes, COMMIT
    assert (at_once, sent_behind) == (4, 2)
    assert attempt.pk == StepAttempt.objects.get(step=step, number=7).pk  # its key, once answered
    assert dict(StepRun.objects.filter(run=run).values_list("name", "lease_owner")) == {"a": "w1", "b": "w2"}


@postgresql
def test_the_writes_of_a_block_leave_together_with_the_statement_that_collects_them(run):
    """Nothing of a write sent behind reaches the driver until its answers are wanted: the
    database is woken once for all of them, not once per write."""
    import tempfile

    from psycopg import pq

    step = first_step(run)
    with transaction.atomic():
        connection.ensure_connection()
        pgconn = connection.connection.pgconn
        with tempfile.TemporaryFile() as trace, writes_behind():
            pgconn.trace(trace.fileno())
            pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
            try:
                some_writes(run, step)
                trace.seek(0)
                held = trace.read()
                lease_owner = StepRun.objects.get(run=run, name="b").lease_owner  # collects
            finally:
                pgconn.untrace()
            trace.seek(0)
            sent = trace.read().decode().splitlines()
    assert held == b""  # nothing handed to the driver yet
    assert lease_owner == "w2"
    frontend = [line.split("\t")[2] for line in sent if line.startswith("F\t")]
    writes = [i for i, kind in enumerate(frontend) if kind == "Execute"]
    syncs = [i for i, kind in enumerate(frontend) if kind == "Sync"]
    # The transaction's BEGIN and the three writes one after the other with one Sync after
    # them, then the read that collected them.
    assert len(writes) == 5 and len(syncs) == 2
    assert writes[3] < syncs[0] < writes[4]


@postgresql
def test_a_held_write_stores_the_value_it_was_given_even_if_the_object_changes_after(run):
    step = first_step(run)
    with transaction.atomic(), writes_behind():
        step.output = {"answer": 1, "items": [1]}
        save_row(step, ["output"])
        step.output["answer"] = 2  # changed in place while the write waits to be sent
        step.output["items"].append(2)
        stored = StepRun.objects.values_list("output", flat=True).get(pk=step.pk)  # collects
    assert stored == {"answer": 1, "items": [1]}


@postgresql
def test_a_statement_that_needs_an_answer_goes_with_the_writes_before_it_and_sees_them(run):
    step = first_step(run)

    def write_then_read():
        with transaction.atomic(), writes_behind():
            some_writes(run, step)
            return StepRun.objects.get(run=run, name="b").lease_owner  # the ORM's own statement

    trips, seen = round_trips(write_then_read)

    assert seen == "w2"
    assert trips == 3  # BEGIN and the writes (one pipeline), the read, COMMIT


@postgresql
def test_an_event_insert_whose_keys_are_read_gets_them_at_once_with_the_writes_before_it(run):
    step = first_step(run)
    with transaction.atomic(), writes_behind():
        some_writes(run, step)
        event = Event(run=run, step=step, kind="test.read", actor="t", payload={})
        insert_rows([event])
        assert event.pk is not None
    assert StepAttempt.objects.filter(step=step, number=7).exists()


@postgresql
def test_a_guarded_save_whose_state_moved_raises_concurrent_transition_when_answered(run):
    step = first_step(run)  # read queued
    StepRun.objects.filter(pk=step.pk).update(state=StepState.RUNNING)  # another writer moved it
    step.lease_owner = "late"

    with pytest.raises(ConcurrentTransition), transaction.atomic(), writes_behind():
        save_row(step)  # sent, not answered: no error yet
        reached = True
    assert reached
    assert StepRun.objects.get(pk=step.pk).lease_owner != "late"  # rolled back with the rest


@postgresql
def test_the_error_of_a_held_write_names_the_service_that_held_it(run):
    step = first_step(run)
    StepRun.objects.filter(pk=step.pk).update(state=StepState.RUNNING)
    step.lease_owner = "late"
    with pytest.raises(ConcurrentTransition) as raised, transaction.atomic(), writes_behind(by="step_test"):
        save_row(step, ["lease_owner"])
        flush()
    assert raised.value.__notes__ == ["raised by a write step_test held (orchestrator.store.held_writes)"]


@postgresql
def test_a_guarded_save_whose_state_moved_is_raised_before_the_error_of_a_write_after_it(run):
    """One by one, the save would have raised first: the write after it is never sent. Behind,
    both are answered together and the save's `ConcurrentTransition` is still what is raised."""
    step = first_step(run)
    StepAttempt.objects.create(step=step, number=7, worker="w0", idempotency_key="k")
    StepRun.objects.filter(pk=step.pk).update(state=StepState.RUNNING)  # another writer moved it
    step.lease_owner = "late"

    with pytest.raises(ConcurrentTransition), transaction.atomic(), writes_behind():
        save_row(step)
        insert_rows([StepAttempt(step=step, number=7, worker="w1", idempotency_key="k")], keys=False)


@postgresql
def test_a_save_of_a_row_that_is_gone_raises(run):
    step = first_step(run)
    StepAttempt.objects.filter(step__run=run).delete()
    StepRun.objects.filter(pk=step.pk).delete()
    step.lease_owner = "w"

    with pytest.raises(DatabaseError, match="no longer exists"), transaction.atomic(), writes_behind():
        save_row(step)


@postgresql
def test_a_failed_write_raises_its_database_error_and_nothing_of_the_block_stays(run):
    step = first_step(run)
    StepAttempt.objects.create(step=step, number=7, worker="w0", idempotency_key="k")

    with pytest.raises(IntegrityError), transaction.atomic(), writes_behind():
        some_writes(run, step)  # its attempt (step, 7) is there already

    assert StepRun.objects.get(pk=step.pk).lease_owner != "w1"


@postgresql
def test_a_savepoint_rolled_back_in_the_block_undoes_only_the_writes_made_inside_it(run):
    step, other = first_step(run), StepRun.objects.get(run=run, name="b")
    with transaction.atomic(), writes_behind():
        step.lease_owner = "kept"
        save_row(step, ["lease_owner"])
        try:
            with transaction.atomic():
                other.lease_owner = "undone"
                save_row(other, ["lease_owner"])
                raise ValueError
        except ValueError:
            pass
    owners = dict(StepRun.objects.filter(run=run).values_list("name", "lease_owner"))
    assert owners == {"a": "kept", "b": ""}


@postgresql
def test_writes_sent_before_an_error_left_the_block_stay_when_the_transaction_goes_on(run):
    step = first_step(run)
    with transaction.atomic():
        try:
            with writes_behind():
                step.lease_owner = "before the error"
                save_row(step, ["lease_owner"])
                raise ValueError
        except ValueError:
            pass
    assert StepRun.objects.get(pk=step.pk).lease_owner == "before the error"


@postgresql
def test_where_statements_are_counted_the_writes_are_held_as_anywhere_and_logged_when_sent(run):
    """DEBUG and `CaptureQueriesContext` see the path production runs: nothing is sent until
    the flush, then every held write is logged."""
    step = first_step(run)
    with CaptureQueriesContext(connection) as counted, transaction.atomic(), writes_behind():
        some_writes(run, step)
        held = [q["sql"] for q in counted.captured_queries]
        flush()
        sent = [q["sql"].split()[0] for q in counted.captured_queries[len(held):]]
    assert (held, sent) == (["BEGIN"], ["UPDATE", "UPDATE", "INSERT"])
    assert StepAttempt.objects.filter(step=step, number=7).exists()


@postgresql
def test_a_statement_django_sends_in_the_block_goes_after_the_held_writes_and_sees_them(run):
    step = first_step(run)
    with transaction.atomic(), writes_behind():
        step.lease_owner = "held"
        save_row(step, ["lease_owner"])
        assert StepRun.objects.get(pk=step.pk).lease_owner == "held"


def test_outside_a_transaction_the_block_writes_at_once(run):
    step = first_step(run)
    with writes_behind():
        step.lease_owner = "now"
        save_row(step, ["lease_owner"])
        assert StepRun.objects.get(pk=step.pk).lease_owner == "now"
        assert update_rows(StepRun, where={"id": step.pk}, values={"lease_owner": "again"}) == 1


@postgresql
def test_a_save_refused_before_an_error_left_the_block_is_not_lost_behind_that_error(run):
    """Answered at once, the save would have raised before the error: the block does not let
    whoever catches the error go on as if the row had been written."""
    step = first_step(run)
    StepRun.objects.filter(pk=step.pk).update(state=StepState.RUNNING)
    step.lease_owner = "late"

    with pytest.raises(ConcurrentTransition), transaction.atomic():
        try:
            with writes_behind():
                save_row(step)
                raise ValueError
        except ValueError:
            pass


@postgresql
def test_with_the_pipeline_turned_off_every_write_waits_for_its_answer(run, settings):
    settings.STEPWISE_FAST_STORE = {**settings.STEPWISE_FAST_STORE, "PIPELINE": False}
    step = first_step(run)

    def write():
        with transaction.atomic(), writes_behind():
            attempt = some_writes(run, step)
            assert attempt.pk is not None
    trips, _ = round_trips(write)

    assert trips == 5  # BEGIN, 3 writes, COMMIT


# --- reads sent together (`compiled.read_together`) ---------------------------------------


# --- writes left for the COMMIT (`insert_json_rows` last in a block) -------------------------


def event_row(run, kind: str, **values) -> dict:
    return {"run_id": str(run.id), "step_id": None, "kind": kind, "actor": "test", "payload": {},
            "created_at": "2026-01-01T00:00:00+00:00", **values}


def kinds_stored(run) -> list[str]:
    return list(Event.objects.filter(run=run, actor="test").order_by("id").values_list("kind", flat=True))


def nothing_left_behind() -> bool:
    return getattr(connection, "_stepwise_behind", None) is None


@postgresql
def test_writes_left_for_the_commit_go_with_it_in_one_round_trip(run):
    def write():
        with transaction.atomic():
            StepRun.objects.filter(run=run, name="a").update(lease_owner="w1")
            with writes_behind():
                insert_json_rows(Event, [event_row(run, "left.for.commit")])

    trips, _ = round_trips(write)

    assert trips == 3  # BEGIN; the UPDATE; the INSERT with the COMMIT (4 when it waits for its own)
    assert kinds_stored(run) == ["left.for.commit"]
    assert nothing_left_behind()


@postgresql
def test_a_write_left_for_the_commit_goes_before_the_next_statement_which_sees_it(run):
    with transaction.atomic():
        with writes_behind():
            insert_json_rows(Event, [event_row(run, "first")])
        seen = kinds_stored(run)  # a statement of Django's
        with writes_behind():
            insert_json_rows(Event, [event_row(run, "second")])
        with writes_behind():  # a block after it: its writes go behind the one left
            insert_json_rows(Event, [event_row(run, "third")])
            step = first_step(run)  # the compiled path: collects both
        with transaction.atomic():  # a savepoint
            insert_json_rows(Event, [event_row(run, "fourth")])
    assert seen == ["first"]
    assert step.name == "a"
    assert kinds_stored(run) == ["first", "second", "third", "fourth"]
    assert nothing_left_behind()


@postgresql
def test_a_rollback_takes_back_a_write_left_for_the_commit_unsent(run):
    with pytest.raises(ValueError), transaction.atomic():
        with writes_behind():
            insert_json_rows(Event, [event_row(run, "rolled.back")])
        raise ValueError
    assert nothing_left_behind()
    with transaction.atomic():  # the next transaction does not send it
        StepRun.objects.filter(run=run, name="a").update(lease_owner="next")
    assert kinds_stored(run) == []


@postgresql
def test_a_write_left_for_the_commit_that_fails_fails_the_commit_and_nothing_stays(run):
    step = first_step(run)
    with pytest.raises(IntegrityError, match="kind"), transaction.atomic():
        StepRun.objects.filter(pk=step.pk).update(lease_owner="inside")
        with writes_behind():
            insert_json_rows(Event, [event_row(run, "fine"), event_row(run, None)])
    assert nothing_left_behind()
    assert StepRun.objects.get(pk=step.pk).lease_owner != "inside"
    assert kinds_stored(run) == []
    with transaction.atomic():  # the connection goes on
        insert_json_rows(Event, [event_row(run, "after")])
    assert kinds_stored(run) == ["after"]


@postgresql
def test_with_an_engine_that_holds_nothing_every_write_is_sent_at_once(run, monkeypatch):
    """Django's own PostgreSQL engine (a settings module naming it instead of `DATABASE_URL`)
    neither sends held writes before its statements nor with its COMMIT: nothing is held."""
    from django.db import connections
    from django.db.backends.postgresql.base import DatabaseWrapper

    wrapper = connections["default"]
    monkeypatch.setattr(wrapper, "_commit", partial(DatabaseWrapper._commit, wrapper))
    monkeypatch.setattr(wrapper, "holds_writes", False, raising=False)

    def write():
        with transaction.atomic():
            StepRun.objects.filter(run=run, name="a").update(lease_owner="w1")
            with writes_behind():
                insert_json_rows(Event, [event_row(run, "sent.at.block.end")])
            assert nothing_left_behind()

    trips, _ = round_trips(write)

    assert trips == 4  # BEGIN; the UPDATE; the INSERT; COMMIT
    assert kinds_stored(run) == ["sent.at.block.end"]


@postgresql
def test_an_error_in_the_block_sends_its_writes_at_once_as_before(run):
    """A block that raises leaves nothing for the COMMIT: a caller that goes on in the
    transaction has had every write of the block answered."""
    with transaction.atomic():
        with pytest.raises(ValueError), writes_behind():
            insert_json_rows(Event, [event_row(run, "sent")])
            raise ValueError
        assert nothing_left_behind()
    assert kinds_stored(run) == ["sent"]


@postgresql
def test_a_run_locked_with_its_steps_is_read_in_one_round_trip(run):
    step = first_step(run)

    def lock_and_read():
        with transaction.atomic():
            return selectors.lock_run_with_steps(step.id)

    trips, (locked, found, steps) = round_trips(lock_and_read)

    assert trips == 2  # BEGIN, the lock and the steps (one pipeline), COMMIT
    assert locked.id == run.id and found.id == step.id
    assert [s.name for s in steps] == ["a", "b"] and all(s.run is locked for s in steps)


@postgresql
def test_a_transaction_begun_with_its_first_statements_holds_their_locks_and_rolls_back(run):
    """The BEGIN sent with the lock's read (`compiled._begin_behind`) opens the transaction
    before it: the run's row lock is held until the end, and what the block wrote goes when
    it fails."""
    import psycopg
    from django.db import connection as django_connection

    step = first_step(run)
    params = django_connection.get_connection_params()
    params.pop("context", None), params.pop("cursor_factory", None)
    with pytest.raises(ValueError), transaction.atomic():
        trips, _ = round_trips(lambda: selectors.lock_run_with_steps(step.id))
        StepRun.objects.filter(pk=step.pk).update(lease_owner="inside")
        with psycopg.connect(**params, autocommit=True) as other:
            with pytest.raises(psycopg.errors.LockNotAvailable):
                other.execute("SELECT 1 FROM orchestrator_run WHERE id = %s FOR UPDATE NOWAIT", [run.id])
        raise ValueError
    assert trips == 1  # BEGIN, the lock and the steps
    assert StepRun.objects.get(pk=step.pk).lease_owner != "inside"


@postgresql
def test_steps_read_behind_the_lock_see_what_the_locks_holder_committed(run):
    """The steps' statement is sent with the lock's, but runs once the lock is granted: it
    sees the step the lock's previous holder changed, as a read sent after the lock would."""
    step = first_step(run)
    locked, release = threading.Event(), threading.Event()

    def holder():
        with transaction.atomic():
            selectors.lock_run(run.id)
            StepRun.objects.filter(pk=step.pk).update(lease_owner="the holder")
            locked.set()
            release.wait(10)
        connection.close()

    thread = threading.Thread(target=holder)
    thread.start()
    assert locked.wait(10)
    threading.Timer(0.5, release.set).start()  # commits while this read waits for the lock
    with transaction.atomic():
        _, found, steps = selectors.lock_run_with_steps(step.id)
    thread.join(10)

    assert release.is_set()
    assert found.lease_owner == "the holder"
    assert {s.name: s.lease_owner for s in steps}["a"] == "the holder"


def test_reads_together_give_what_each_read_gives_alone(run):
    step = first_step(run)
    with transaction.atomic():
        apart = (selectors._LOCKED_RUN_OF_STEP.rows(step.id)[0], selectors.steps_of(run))
    with transaction.atomic():
        together = selectors.lock_run_with_steps(step.id)
    assert together[0].pk == apart[0].pk
    assert [(s.pk, s.state, s.output) for s in together[2]] == [(s.pk, s.state, s.output) for s in apart[1]]
    with transaction.atomic():
        alone = selectors.lock_run_of_step(step.id)
    assert (alone[0].pk, alone[1].pk) == (run.pk, step.pk)


def test_reads_together_where_statements_are_counted_are_logged_one_by_one(run):
    step = first_step(run)
    with CaptureQueriesContext(connection) as counted, transaction.atomic():
        selectors.lock_run_with_steps(step.id)
    assert len([q for q in counted.captured_queries if q["sql"].startswith("SELECT")]) == 2


def test_a_step_that_is_not_there_raises_as_before():
    """No run is found for it, as when the lock was read alone."""
    for read in (selectors.lock_run_with_steps, selectors.lock_run_of_step):
        with pytest.raises(Run.DoesNotExist), transaction.atomic():
            read(10**9)
