"""A compiled statement of the fast store does what the ORM's own path does.

The fast store's own statements, so these run with the fast store only (marker `fast_store`).

A compiled read gives what its queryset gives: the same rows, fields, deferred fields and
joined instances, the same lock, and the same error outside a transaction. A compiled insert
stores what `bulk_create` stores and gives the keys; a save writes the same columns under the
same state guard, and raises where Django and django-fsm raise.
"""
import re
from decimal import Decimal
from unittest import mock

import pytest
from django.db import DatabaseError, connection, transaction
from django.db.models import Model
from django.db.models.sql.compiler import SQLUpdateCompiler
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext
from django_fsm import ConcurrentTransition

from audit.models import AuditEntry
from orchestrator.engine import selectors
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, Run, StepAttempt, StepRun
from orchestrator.store.fast import save_row
from orchestrator.store.fast.compiled import MAX_COMPILED_ROWS, CompiledRead, build_row, insert_rows
from tests.factories import SETUP

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.fast_store]


@pytest.fixture
def run(team):
    version, _ = workflow_save(team=team, definition={
        "name": "compiled", "input_schema": {"type": "object"}, "steps": [
            {"name": "a", "type": "tool", "tool": "core.echo", "params": {"text": "{{ input.word }}"}},
            {"name": "b", "type": "tool", "tool": "core.echo", "after": ["a"]},
            {"name": "c", "type": "tool", "tool": "core.echo", "after": ["a"]}]}, actor=SETUP)
    return run_start(version=version, input={"word": "hello"}, actor=SETUP)


def fields_of(obj) -> dict:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields
            if f.attname not in obj.get_deferred_fields()}


def test_the_locked_run_of_a_step_is_the_querysets_with_the_same_joined_instances(run):
    step = run.steps.get(name="b")
    with transaction.atomic():
        expected = selectors._locked_runs().get(steps__id=step.id)
        found = selectors._LOCKED_RUN_OF_STEP.rows(step.id)[0]
    assert fields_of(found) == fields_of(expected)
    assert found.get_deferred_fields() == expected.get_deferred_fields()
    for joined in ("version", "team"):
        assert Run._meta.get_field(joined).is_cached(found)
        assert fields_of(getattr(found, joined)) == fields_of(getattr(expected, joined))
    assert found.version.get_deferred_fields() == {"definition", "normalized"}
    assert fields_of(found.version.workflow) == fields_of(expected.version.workflow)
    with CaptureQueriesContext(connection) as queries:
        assert found.team.slug and found.version.workflow.name and found.version.digest
    assert not queries, "a joined instance was read again"


def test_the_step_a_claim_reads_is_the_querysets_with_the_same_joined_instances(run):
    step = run.steps.get(name="a")
    expected = StepRun.objects.select_related(
        "run", "run__team", "run__version__workflow", "run__sealed_secrets").defer(
        "run__version__definition", "run__version__normalized").get(id=step.id)
    found = selectors.step_to_claim(step.id)
    assert fields_of(found) == fields_of(expected)
    assert fields_of(found.run) == fields_of(expected.run)
    assert found.run.version.get_deferred_fields() == {"definition", "normalized"}
    with CaptureQueriesContext(connection) as queries:
        assert (found.run.team.slug, found.run.version.workflow.name, found.run.version.digest) == (
            expected.run.team.slug, expected.run.version.workflow.name, expected.run.version.digest)
        assert not hasattr(found.run, "sealed_secrets")  # none: known without a query
    assert not queries, "a joined instance was read again"
    with pytest.raises(StepRun.DoesNotExist):
        selectors.step_to_claim(step.id + 10_000)


def test_a_runs_steps_come_in_the_querysets_order_with_their_values_and_without_input(run):
    expected = list(StepRun.objects.defer("input").filter(run_id=run.id))
    found = selectors.steps_of(run)
    assert [s.id for s in found] == [s.id for s in expected]
    assert [fields_of(s) for s in found] == [fields_of(s) for s in expected]
    assert all(s.get_deferred_fields() == {"input"} for s in found)
    assert all(s.run is run for s in found)
    ready = next(s for s in found if s.name == "a")
    assert ready.input == {"input": {"word": "hello"}, "steps": {}}  # loaded when read


def test_a_locked_read_takes_the_same_row_lock_as_its_queryset(run):
    with transaction.atomic():
        with CaptureQueriesContext(connection) as queries:
            selectors.lock_run(run.id)
        expected = str(selectors._locked_runs().filter(id=run.id).query)
    lock_clause = expected[expected.index(" FROM "):].split("WHERE")[0]
    assert lock_clause in queries[-1]["sql"]
    if connection.features.has_select_for_update:
        assert "FOR NO KEY UPDATE OF" in queries[-1]["sql"]


def test_a_locked_read_outside_a_transaction_raises_as_the_queryset_does(run):
    with transaction.atomic():
        selectors.lock_run(run.id)  # compiled on this connection
    if not connection.features.has_select_for_update:
        pytest.skip("SQLite has no row locks: the queryset does not raise either")
    with pytest.raises(TransactionManagementError):
        selectors.lock_run(run.id)


def test_what_is_not_there_raises_does_not_exist(run):
    with transaction.atomic():
        with pytest.raises(Run.DoesNotExist):
            selectors.lock_run("00000000-0000-0000-0000-000000000001")
        with pytest.raises(Run.DoesNotExist):
            selectors.lock_run_of_step(10**9)


def test_a_read_given_the_wrong_number_of_values_says_so(run):
    read = CompiledRead(lambda name: StepRun.objects.filter(name=name), "")
    assert [s.name for s in read.rows("a")] == ["a"]
    with pytest.raises(TypeError, match="takes 1 values, 2 given"):
        read.rows("a", "b")


def test_a_read_with_annotations_is_refused(run):
    from django.db.models import F

    read = CompiledRead(lambda name: StepRun.objects.annotate(twice=F("position")).filter(name=name), "")
    with pytest.raises(ValueError, match="model columns only"):
        read.rows("a")


# --- writes ---------------------------------------------------------------------------------


def stored(model, pk) -> dict:
    return model.objects.filter(pk=pk).values().get()


def events_of(run, n: int, kind: str) -> list[Event]:
    step = run.steps.get(name="a")
    return [Event(run=run, step=step if i % 2 else None, kind=kind, actor="worker:test",
                  payload={"i": i, "nested": {"list": [1, "two", None]}, "text": "é\u2028"})
            for i in range(n)]


@pytest.mark.parametrize("rows", [1, 4, MAX_COMPILED_ROWS, MAX_COMPILED_ROWS + 5])
def test_inserted_rows_are_the_rows_bulk_create_writes_and_get_their_keys(run, rows):
    with transaction.atomic():
        ours, django = events_of(run, rows, "test.ours"), events_of(run, rows, "test.django")
        insert_rows(ours)
        Event.objects.bulk_create(django)
    assert all(e.pk and not e._state.adding and e._state.db == "default" for e in ours)
    assert len({e.pk for e in ours}) == rows
    for mine, theirs in zip(ours, django, strict=True):
        row, expected = stored(Event, mine.pk), stored(Event, theirs.pk)
        for differs in ("id", "kind", "created_at"):
            row.pop(differs), expected.pop(differs)
        assert row == expected
        assert stored(Event, mine.pk)["created_at"] == mine.created_at


@pytest.mark.parametrize("operation", ["insert", "save"])
def test_a_related_object_not_saved_is_refused_as_django_refuses_it(run, operation):
    from orchestrator.store.fast.compiled import update_row

    unsaved = StepRun(run=run, name="unsaved", kind="tool", position=9)
    if operation == "insert":
        write = lambda: insert_rows([StepAttempt(step=unsaved, number=1, worker="w", idempotency_key="k")])  # noqa: E731
        message = "bulk_create() prohibited to prevent data loss due to unsaved related object 'step'."
    else:
        attempt = StepAttempt.objects.create(step=run.steps.first(), number=1, worker="w", idempotency_key="k")
        attempt.step = unsaved
        write = lambda: update_row(attempt, ("step",))  # noqa: E731
        message = "save() prohibited to prevent data loss due to unsaved related object 'step'."
    with pytest.raises(ValueError) as refused, transaction.atomic():
        write()
    assert str(refused.value) == message


def test_a_related_object_saved_after_it_was_assigned_gives_its_key(run):
    step = StepRun(run=run, name="later", kind="tool", position=9)
    attempt = StepAttempt(step=step, number=1, worker="w", idempotency_key="k")
    step.save()  # after the assignment: the attempt's step_id is still empty
    insert_rows([attempt])
    assert StepAttempt.objects.get(pk=attempt.pk).step_id == step.pk


def test_an_insert_is_one_statement_whatever_the_rows(run):
    events = events_of(run, 5, "test.one")
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        insert_rows(events)
    assert [q["sql"].split()[0] for q in queries] == ["INSERT"]


def test_ledger_entries_appended_through_the_compiled_insert_chain_and_verify(run):
    from audit.chain import verify_ledger

    entries = AuditEntry.objects.filter(run_id=run.id)
    assert entries.count() >= 3  # run.created, run.running, step.ready...
    assert all(e.digest for e in entries)
    report = verify_ledger()
    assert report.ok, report.broken
    assert report.count >= entries.count()


def test_ledger_entries_appended_from_their_fields_are_the_rows_their_instances_make(run):
    """`chain.append_all` (the events' entries: on PostgreSQL sent as one JSON parameter, no
    instance built) stores what `link_and_insert_all` stores for the same fields."""
    from audit import chain
    from audit.services import _entry_fields

    fields = [_entry_fields(action="test.json", actor="worker:tést", subject_type="run", subject_id=run.id,
                            outcome="ok", run=run, step=None, payload={"i": i, "text": "é\u2028", "n": None},
                            payload_ref="", redactor=None, proposal_hash="", model="", prompt_version="",
                            idempotency_key=f"key-{i}", correlation_id="", event_id=i or None, workflow="",
                            workflow_version=None, definition_digest="", team="") for i in range(3)]
    with transaction.atomic():
        before = AuditEntry.objects.order_by("-id").values_list("id", flat=True).first() or 0
        chain.append_all([dict(f) for f in fields])
        instances = chain.link_and_insert_all([AuditEntry(**f) for f in fields])
    stored_rows = list(AuditEntry.objects.filter(id__gt=before).order_by("id").values())
    appended = [r for r in stored_rows if r["id"] not in {e.pk for e in instances}]
    inserted = [r for r in stored_rows if r["id"] in {e.pk for e in instances}]
    assert len(appended) == len(inserted) == 3
    for mine, theirs in zip(appended, inserted, strict=True):
        for differs in ("id", "sequence", "prev_hash", "hash"):
            mine.pop(differs), theirs.pop(differs)
        assert mine == theirs
    report = chain.verify_ledger()
    assert report.ok, report.broken


def test_json_rows_lacking_a_column_are_refused(run):
    if connection.vendor != "postgresql":
        pytest.skip("rows go as JSON on PostgreSQL only")
    from audit import chain
    from audit.services import _entry

    entry = _entry(action="test.json", actor="worker:test", subject_type="run", subject_id=run.id,
                   outcome="", run=run, step=None, payload={}, payload_ref="", redactor=None,
                   proposal_hash="", model="", prompt_version="", idempotency_key="",
                   correlation_id="", event_id=None, workflow="", workflow_version=None,
                   definition_digest="", team="")
    row = chain.entry_row(entry)
    del row["payload_ref"]
    with transaction.atomic(), pytest.raises(ValueError, match="payload_ref"):
        chain.insert_json_rows(AuditEntry, [row])


def test_timestamps_read_through_the_c_loader_are_what_djangos_loader_reads():
    """Every PostgreSQL connection reads `timestamptz` with psycopg's C loader (Django's own
    derives from the pure-Python one); the values are the same, time zone included."""
    if connection.vendor != "postgresql":
        pytest.skip("a PostgreSQL driver's loader")
    from django.db.backends.postgresql.psycopg_any import BaseTzLoader
    from psycopg.postgres import types
    from psycopg.pq import Format

    connection.ensure_connection()
    oid = types["timestamptz"].oid
    ours = connection.connection.adapters.get_loader(oid, Format.TEXT)
    assert ours.__module__ == "orchestrator.store.fast.connection"
    assert ours.timezone is connection.timezone
    texts = ["2026-12-04 13:59:09.279645+00", "2026-01-02 03:04:05.123456+05:30",
             "0044-03-15 12:00:00+00", "1999-12-31 23:59:59.999999-08", "2000-02-29 00:00:00+00"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(["%s::timestamptz"] * len(texts)), texts)
        found = cursor.fetchone()

        class Djangos(BaseTzLoader):
            timezone = connection.timezone

        cursor.cursor.adapters.register_loader("timestamptz", Djangos)
        cursor.execute("SELECT " + ", ".join(["%s::timestamptz"] * len(texts)), texts)
        expected = cursor.fetchone()
    assert found == expected
    assert [v.tzinfo for v in found] == [v.tzinfo for v in expected] == [connection.timezone] * len(texts)


def test_an_update_writes_only_the_named_columns(run):
    step = run.steps.get(name="a")
    step.lease_owner, step.skip_reason = "written", "not written"
    save_row(step, ["lease_owner"])
    row = stored(StepRun, step.pk)
    assert (row["lease_owner"], row["skip_reason"]) == ("written", "")


def test_a_whole_save_of_a_row_read_without_its_input_leaves_the_input_alone(run):
    before = stored(StepRun, run.steps.get(name="a").pk)["input"]
    step = StepRun.objects.defer("input").get(run=run, name="a")
    step.lease_owner = "written"
    save_row(step)
    row = stored(StepRun, step.pk)
    assert row["lease_owner"] == "written" and row["input"] == before


def test_a_save_after_another_writer_moved_the_state_raises_concurrent_transition(run):
    mine = run.steps.get(name="b")
    theirs = run.steps.get(name="b")
    theirs.skip(reason="theirs")
    theirs.save()
    mine.skip(reason="mine")
    with pytest.raises(ConcurrentTransition):
        save_row(mine)
    assert stored(StepRun, mine.pk)["skip_reason"] == "theirs"


def test_a_save_moves_the_guard_to_the_new_state(run):
    step = run.steps.get(name="b")
    step.skip(reason="first")
    save_row(step)
    step.skip_reason = "again"
    save_row(step)  # guarded by the state it was saved in, not the one it was read in
    assert stored(StepRun, step.pk)["skip_reason"] == "again"


def test_saving_named_columns_of_a_row_that_is_gone_raises_and_a_whole_save_inserts_it(run):
    step = run.steps.get(name="c")
    StepRun.objects.filter(pk=step.pk).delete()
    with pytest.raises(DatabaseError, match="did not affect any rows"):
        save_row(step, ["lease_owner"])
    save_row(step)  # as Django's save does: the row is written again
    assert stored(StepRun, step.pk)["name"] == "c"


def test_a_transitions_save_builds_no_statement_through_the_orms_compiler(run):
    step = run.steps.get(name="b")
    with mock.patch.object(SQLUpdateCompiler, "as_sql", autospec=True,
                           side_effect=SQLUpdateCompiler.as_sql) as compiled:
        step.skip(reason="compiled once")
        save_row(step)
        run.progressed_at = run.progressed_at
        save_row(run, ["progressed_at"])
    assert compiled.call_count == 0
    assert stored(StepRun, step.pk)["state"] == "skipped"


def read_step(run, name: str) -> StepRun:
    """A step as the engine reads it: through the compiled read of the run's steps."""
    return next(s for s in selectors.steps_of(run) if s.name == name)


def set_columns(queries) -> list[set[str]]:
    updates = [q["sql"] for q in queries if q["sql"].startswith("UPDATE")]
    return [set(re.findall(r'"(\w+)" = ', sql.split(" WHERE ")[0])) for sql in updates]


def test_a_whole_save_of_a_read_row_writes_the_columns_its_transition_changed(run):
    step = read_step(run, "b")
    step.skip(reason="changed")
    with CaptureQueriesContext(connection) as queries:
        save_row(step)
    assert set_columns(queries) == [{"state", "skip_reason", "finished_at"}]
    expected = stored(StepRun, step.pk)
    assert (expected["state"], expected["skip_reason"]) == ("skipped", "changed")
    assert expected["finished_at"] == step.finished_at


def test_a_column_set_back_to_the_value_it_was_read_with_is_written(run):
    step = read_step(run, "b")
    step.lease_owner = "worker:one"
    save_row(step)
    step.lease_owner = ""  # what it was read with, and no longer what the row holds
    step.skip_reason = "second"  # so that the save is not of every column
    save_row(step)
    assert (stored(StepRun, step.pk)["lease_owner"], stored(StepRun, step.pk)["skip_reason"]) == ("", "second")


def test_a_value_changed_in_place_is_written(run):
    step = read_step(run, "b")
    step.error = {"class": "first", "tries": [1]}
    save_row(step)
    step.error["tries"].append(2)
    step.skip_reason = "second"  # so that the save is not of every column
    save_row(step)
    assert stored(StepRun, step.pk)["error"] == {"class": "first", "tries": [1, 2]}


def test_a_whole_save_that_changes_nothing_still_finds_the_state_moved(run):
    mine = read_step(run, "b")
    theirs = run.steps.get(name="b")
    theirs.skip(reason="theirs")
    theirs.save()
    with pytest.raises(ConcurrentTransition):
        save_row(mine)


def test_a_row_read_again_from_the_database_is_written_whole(run):
    step = read_step(run, "b")
    StepRun.objects.filter(pk=step.pk).update(lease_owner="theirs")
    step.refresh_from_db()
    step.lease_owner = ""  # what the compiled read gave, not what refresh_from_db did
    step.skip_reason = "mine"  # so that the save is not of every column
    save_row(step)
    assert (stored(StepRun, step.pk)["lease_owner"], stored(StepRun, step.pk)["skip_reason"]) == ("", "mine")


def test_a_row_saved_by_djangos_own_save_in_between_is_written_whole(run):
    """An admin's or operator's save is Django's: the store no longer knows what the row holds."""
    step = read_step(run, "b")
    step.lease_owner = "django"
    step.save()
    step.lease_owner = ""  # what the compiled read gave, not what Django's save wrote
    step.skip_reason = "mine"  # so that the save is not of every column
    save_row(step)
    assert (stored(StepRun, step.pk)["lease_owner"], stored(StepRun, step.pk)["skip_reason"]) == ("", "mine")


def test_a_run_inserted_with_its_own_key_is_the_row_save_writes_and_guards_its_state(run):
    from orchestrator.engine.states import RunState

    ours, django = (Run(team=run.team, version=run.version, input={"k": [1]}) for _ in range(2))
    for new in (ours, django):
        new.start()
    insert_rows([ours])
    django.save(force_insert=True)
    row, expected = stored(Run, ours.pk), stored(Run, django.pk)
    for differs in ("id", "created_at", "started_at", "progressed_at"):
        row.pop(differs), expected.pop(differs)
    assert row == expected and row["state"] == RunState.RUNNING
    ours.pause(reason={"class": "test"})
    save_row(ours)  # guarded by the state it was inserted in
    assert stored(Run, ours.pk)["state"] == ours.state


def test_updated_rows_are_what_a_querysets_update_writes(run):
    from decimal import Decimal

    from orchestrator.models import StepAttempt
    from orchestrator.store.fast.compiled import update_rows

    step = run.steps.get(name="a")
    for number in (1, 2):
        StepAttempt.objects.create(step=step, number=number, worker="w", idempotency_key="k")
    values = {"outcome": "succeeded", "cost_usd": Decimal("0.1234567"), "model_params": {"t": 0.5},
              "error_message": "é"}
    assert update_rows(StepAttempt, where={"step": step, "number": 1}, values=values) == 1
    StepAttempt.objects.filter(step=step, number=2).update(**values)
    ours, theirs = (StepAttempt.objects.filter(step=step, number=n).values(*values).get() for n in (1, 2))
    assert ours == theirs
    assert update_rows(StepAttempt, where={"step": step.pk, "number": 9}, values=values) == 0


def test_text_values_of_every_kind_are_stored_as_the_orm_stores_them(run):
    from django.utils.functional import lazy

    from orchestrator.engine.states import StepState

    texts = ["plain", "", lazy(lambda: "lazy", str)(), StepState.READY]
    ours = [Event(run=run, kind=text, actor=text) for text in texts]
    theirs = [Event(run=run, kind=text, actor=text) for text in texts]
    with transaction.atomic():
        insert_rows(ours)
        Event.objects.bulk_create(theirs)
    for mine, expected in zip(ours, theirs, strict=True):
        row, other = stored(Event, mine.pk), stored(Event, expected.pk)
        assert (row["kind"], row["actor"]) == (other["kind"], other["actor"])
    assert stored(Event, ours[2].pk)["kind"] == "lazy"
    assert stored(Event, ours[3].pk)["kind"] == "ready"


def test_the_widest_compiled_insert_is_parsed_by_psycopg_once(run):
    from orchestrator.store.fast.compiled import _insert_plan

    widest = max(len(_insert_plan(model, connection, MAX_COMPILED_ROWS)[1])
                 for model in (AuditEntry, Event, Run, StepRun))
    if connection.vendor != "postgresql":
        return  # SQLite's driver has no such cache
    from psycopg import _queries

    connection.ensure_connection()  # the store raises the bound as it sets a connection up
    assert _queries.MAX_CACHED_STATEMENT_PARAMS >= MAX_COMPILED_ROWS * widest
    with transaction.atomic():
        insert_rows(events_of(run, MAX_COMPILED_ROWS, "test.first"))  # 96 values
        before = _queries._query2pg.cache_info()
        insert_rows(events_of(run, MAX_COMPILED_ROWS, "test.again"))
    after = _queries._query2pg.cache_info()
    assert after.hits > before.hits and after.misses == before.misses


def test_a_statement_sent_again_goes_on_its_cursor_with_the_drivers_adapters_kept(run):
    """Each compiled statement is given back the cursor it used last: psycopg makes a cursor
    new adapters for its values and columns whenever the cursor's statement changes."""
    if connection.vendor != "postgresql":
        pytest.skip("psycopg's adapters")
    from orchestrator.store.fast.compiled import _cursors, _insert_plan

    step = run.steps.get(name="a")
    seen = []
    with transaction.atomic():
        for _ in range(3):
            selectors.lock_run_with_steps(step.id)
            insert_rows(events_of(run, 2, "test.again"))
            kept = _cursors(connection).kept
            sql = _insert_plan(Event, connection, 2)[0]
            [cursor] = kept[sql]
            seen.append((cursor, cursor._tx))
    assert len({id(c) for c, _ in seen}) == 1 and len({id(tx) for _, tx in seen}) == 1


def test_every_shortcut_gives_what_the_fields_own_chain_gives():
    """Each field of the hot path's models, given the values the engine writes and values a
    shortcut must leave to the field: the same database value, of the same type."""
    import datetime
    import uuid
    from decimal import Decimal

    from django.utils import timezone

    from orchestrator.models import StepAttempt
    from orchestrator.store.fast.compiled import _preparer

    aware = timezone.now()
    samples = [None, "", "text", 0, 7, 2**40, True, False, Decimal("1.5"), aware,
               aware.astimezone(datetime.timezone(datetime.timedelta(hours=2))),
               uuid.uuid4(), str(uuid.uuid4()), "12", 3.0, {"a": 1}, [1]]
    checked = 0
    for model in (AuditEntry, Event, Run, StepRun, StepAttempt):
        for field in model._meta.concrete_fields:
            if getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
                continue
            quick = _preparer(field, connection)
            for value in samples:
                obj = model.__new__(model)
                obj.__dict__[field.attname] = value
                try:
                    expected = field.get_db_prep_save(value, connection)
                except Exception as error:  # the field refuses it: so must the shortcut
                    with pytest.raises(type(error)):
                        quick(obj, False, connection)
                    continue
                got = quick(obj, False, connection)
                assert type(got) is type(expected), (model, field.name, value)
                # psycopg's wrappers (Jsonb, Int8...) compare by what they wrap
                assert getattr(got, "obj", got) == getattr(expected, "obj", expected), (model, field.name, value)
                checked += 1
    assert checked > 300


# --- new rows from keywords -----------------------------------------------------------------


def built_by_django(model, **kwargs):
    obj = model.__new__(model)
    Model.__init__(obj, **kwargs)
    return obj


def instance_state(obj) -> tuple:
    """Everything `__init__` leaves in an instance; a value its field's callable default made
    (a timestamp) is compared by type."""
    callables = {f.attname for f in obj._meta.fields if f.has_default() and callable(f.default)}
    values = {name: (type(value) if name in callables else value)
              for name, value in vars(obj).items() if name != "_state"}
    state = obj._state
    return values, state.adding, state.db, {k: id(v) for k, v in state.fields_cache.items()}


def keyword_builds(run, step) -> list[tuple]:
    return [
        (Event, {"run": run, "step": step, "kind": "step.ready", "actor": "worker:w",
                 "payload": {"a": [1, "two"]}}),
        (Event, {"run": run, "kind": "run.created"}),  # every other field its default
        (Event, {"run_id": run.id, "step_id": step.id, "kind": "by key"}),
        (Event, {"run": run, "step": None, "kind": "no step"}),
        (StepAttempt, {"step": step, "number": 2, "worker": "w", "idempotency_key": "k",
                       "cost_usd": Decimal("0.5")}),
        (AuditEntry, {"actor": "system:test", "action": "step.ready", "run_id": run.id,
                      "workflow_version": 3, "payload": "{}", "event_id": 7}),
    ]


def test_a_row_built_from_keywords_is_what_djangos_init_builds(run):
    step = run.steps.get(name="a")
    for model, kwargs in keyword_builds(run, step):
        ours, theirs = build_row(model, **kwargs), built_by_django(model, **kwargs)
        assert instance_state(ours) == instance_state(theirs), model.__name__


def test_a_row_built_from_keywords_does_not_go_through_djangos_init(run):
    step = run.steps.get(name="a")
    with mock.patch.object(Model, "__init__", autospec=True, side_effect=Model.__init__) as django_init:
        for model, kwargs in keyword_builds(run, step):
            build_row(model, **kwargs)
    assert django_init.call_count == 0


def test_a_default_made_by_a_callable_is_made_for_each_row(run):
    first, second = build_row(Event, run=run, kind="one"), build_row(Event, run=run, kind="two")
    assert first.payload == second.payload == {} and first.payload is not second.payload


def test_what_djangos_init_refuses_is_refused_the_same_way(run):
    step = run.steps.get(name="a")
    for kwargs, error in (({"run": run, "kind": "x", "colour": "red"}, TypeError),
                          ({"run": step, "kind": "x"}, ValueError),
                          ({"run": run, "run_id": run.id, "kind": "x"}, None)):
        if error is None:  # both the instance and its key: Django sets the key after
            assert instance_state(build_row(Event, **kwargs)) == instance_state(built_by_django(Event, **kwargs))
            continue
        with pytest.raises(error) as ours:
            build_row(Event, **kwargs)
        with pytest.raises(error) as theirs:
            built_by_django(Event, **kwargs)
        assert str(ours.value) == str(theirs.value)


def test_a_row_read_by_the_orm_is_built_by_djangos_init(run):
    step = run.steps.get(name="a")
    Event.objects.create(run=run, step=step, kind="read back", payload={"k": 1})
    with mock.patch.object(Model, "__init__", autospec=True, side_effect=Model.__init__) as django_init:
        found = Event.objects.get(run=run, kind="read back")
    assert django_init.call_count == 1 and not found._state.adding and found.payload == {"k": 1}
