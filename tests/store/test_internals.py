"""Each private API the fast store relies on, checked as the store uses it.

docs/architecture.md ("What the fast store relies on") lists them. A Django, django-fsm or
psycopg upgrade that changes one fails here by name, instead of costing speed or changing a
write in silence; the store itself raises where one is missing. Pins in pyproject.toml
follow what passes here.
"""
import inspect

import pytest
from django.db import connection, transaction
from django.db.models import Model
from django.db.models.base import ModelState
from django.db.models.query import get_related_populators
from django_fsm import ConcurrentTransitionMixin

from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, Run, StepRun
from tests.factories import SETUP

# A worker group an earlier test of this process started would run the `run` fixture's step
# under these tests, which read and compare its row.
pytestmark = [pytest.mark.fast_store, pytest.mark.usefixtures("without_workers")]
postgresql = pytest.mark.skipif("connection.vendor != 'postgresql'", reason="psycopg's internals")


@pytest.fixture
def run(team):
    version, _ = workflow_save(team=team, definition={
        "name": "internals", "input_schema": {"type": "object"},
        "steps": [{"name": "a", "type": "tool", "tool": "core.echo"}]}, actor=SETUP)
    return run_start(version=version, input={}, actor=SETUP)


# --- Django --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_djangos_compiler_says_where_each_models_columns_are_after_as_sql():
    """`CompiledRead` reads `klass_info`, `select`, `col_count`, `annotation_col_map` and
    `has_extra_select`, which `as_sql` leaves on the compiler, and `get_converters`,
    `apply_converters` and `get_related_populators` to build rows as `QuerySet.__iter__` does."""
    queryset = StepRun.objects.select_related("run").filter(id=0)
    compiler = queryset.query.get_compiler(using="default")
    compiler.as_sql()
    info = compiler.klass_info
    assert info["model"] is StepRun and list(info["select_fields"])
    assert [child["model"] for child in info["related_klass_infos"]] == [Run]
    assert isinstance(compiler.col_count, int) and len(compiler.select) >= compiler.col_count
    assert compiler.annotation_col_map == {} and compiler.has_extra_select is False
    fields = [column[0] for column in compiler.select[:compiler.col_count]]
    assert isinstance(compiler.get_converters(fields), dict)
    assert len(get_related_populators(info, compiler.select, "default")) == 1
    assert queryset._prefetch_related_lookups == ()
    assert StepRun.objects.select_for_update().query.select_for_update is True


@pytest.mark.django_db
def test_a_compiled_reads_converters_give_what_djangos_apply_converters_gives(run):
    """The fast store applies a plan's converters itself (with the connection reading, since a
    plan outlives the connection it was compiled on): what `apply_converters` gives, for a
    row whose columns each database converts (JSON, UUIDs, timestamps, booleans, decimals)."""
    from orchestrator.store.fast.compiled import CompiledRead, _converted

    read = CompiledRead(lambda key: Run.objects.filter(id=key), run.id)
    queryset = Run.objects.filter(id=run.id)
    compiler = queryset.query.get_compiler(using="default")
    sql, params = compiler.as_sql()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    fields = [column[0] for column in compiler.select[:compiler.col_count]]
    expected = [list(row) for row in compiler.apply_converters(rows, compiler.get_converters(fields))]
    plan = read._plan(connection, "default")
    assert plan.converters or connection.vendor == "postgresql"
    assert _converted(rows, plan.converters, connection) == expected
    assert read.rows(Run._meta.get_field("id").get_db_prep_value(run.id, connection))[0].input == run.input


def test_an_instance_is_built_from_a_model_state_with_adding_and_db():
    """`_from_db` and `build_row` give a new instance `ModelState()` and set `adding`, `db`."""
    state = ModelState()
    assert (state.adding, state.db) == (True, None)
    assert "fields_cache" in dir(state)


def test_djangos_save_checks_on_related_objects_take_an_operation_name():
    parameters = inspect.signature(Model._prepare_related_fields_for_save).parameters
    assert list(parameters)[1:] == ["operation_name", "fields"]
    assert inspect.signature(Model._is_pk_set).parameters.keys() == {"self", "meta"}


@pytest.mark.django_db(transaction=True)
def test_a_pending_on_commit_callback_is_a_tuple_of_savepoints_callback_and_robustness():
    """`orchestrator.engine.txscope` finds its marker at `run_on_commit[index][1]`."""
    def marker() -> None:
        pass

    with transaction.atomic():
        transaction.on_commit(marker)
        pending = connection.run_on_commit[-1]
    assert isinstance(pending, tuple) and pending[1] is marker and len(pending) == 3


def test_the_fast_engine_overrides_the_methods_djangos_engine_has():
    """The engine subclasses Django's and replaces `_commit`, `_rollback` and `_close`, and
    wraps its cursors through `make_cursor` and `make_debug_cursor`."""
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.utils import CursorDebugWrapper, CursorWrapper

    for name in ("_commit", "_rollback", "_close"):
        assert list(inspect.signature(getattr(BaseDatabaseWrapper, name)).parameters) == ["self"], name
    for name in ("make_cursor", "make_debug_cursor"):
        assert list(inspect.signature(getattr(BaseDatabaseWrapper, name)).parameters) == ["self", "cursor"]
    assert issubclass(CursorDebugWrapper, CursorWrapper)
    assert list(inspect.signature(CursorWrapper.execute).parameters) == ["self", "sql", "params"]


# --- django-fsm ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_django_fsm_keeps_the_state_a_row_was_read_in_under_its_mangled_name(run):
    """`update_row` guards its UPDATE with `_ConcurrentTransitionMixin__initial_states` and
    moves it with `_update_initial_state`; a whole save compares a read row with what it held
    only while that dict is the one noted at the read (Django's save and `refresh_from_db`
    note a new one)."""
    step = StepRun.objects.get(run=run, name="a")
    noted = step._ConcurrentTransitionMixin__initial_states
    assert noted == {"state": step.state}
    step._update_initial_state()
    assert step._ConcurrentTransitionMixin__initial_states is not noted
    noted = step._ConcurrentTransitionMixin__initial_states
    step.save(update_fields=["lease_owner"])
    assert step._ConcurrentTransitionMixin__initial_states is not noted
    noted = step._ConcurrentTransitionMixin__initial_states
    step.refresh_from_db()
    assert step._ConcurrentTransitionMixin__initial_states is not noted
    assert ConcurrentTransitionMixin.__init__ is not Model.__init__


# --- psycopg -------------------------------------------------------------------------------


@postgresql
@pytest.mark.django_db(transaction=True)
def test_psycopg_sends_a_command_in_a_pipeline_as_the_fast_store_sends_begin_and_commit():
    """`_begin_behind` sends `_get_tx_start_command()` through `_exec_command`, and
    `_communicate_gen` of the pipeline; `commit_behind` sends a hand-made COMMIT the same way."""
    from psycopg import Connection
    from psycopg._pipeline import Pipeline
    from psycopg.pq import TransactionStatus

    for name in ("_exec_command", "_get_tx_start_command", "wait"):
        assert callable(getattr(Connection, name, None)), name
    assert callable(getattr(Pipeline, "_communicate_gen", None))
    connection.ensure_connection()
    driver = connection.connection
    assert driver.autocommit is True and driver._pipeline is None
    driver.autocommit = False
    try:
        assert driver._get_tx_start_command().startswith(b"BEGIN")
        with driver.pipeline():
            assert driver._pipeline is not None
            driver.wait(driver._exec_command(driver._get_tx_start_command()))
            driver.wait(driver._pipeline._communicate_gen())
            with driver.cursor() as cursor:
                cursor.execute("SELECT 1")
            driver.wait(driver._exec_command(b"COMMIT"))
        assert driver.pgconn.transaction_status == TransactionStatus.IDLE
    finally:
        driver.autocommit = True


@postgresql
@pytest.mark.django_db
def test_psycopg_caches_the_parsing_of_statements_up_to_a_bound_the_store_raises():
    from psycopg import _queries

    from orchestrator.store.fast.connection import CACHED_PARAMS

    connection.ensure_connection()
    assert isinstance(_queries.MAX_CACHED_STATEMENT_PARAMS, int)
    assert _queries.MAX_CACHED_STATEMENT_PARAMS >= CACHED_PARAMS
    assert hasattr(_queries._query2pg, "cache_info")


@postgresql
@pytest.mark.django_db(transaction=True)
def test_a_refused_statement_in_a_pipeline_is_the_context_of_psycopgs_pipeline_aborted(run):
    """`_refusal` finds the statement's own error behind `PipelineAborted`, and
    `_raise_first_in_order` reads `cursor.pgresult` (None: not answered)."""
    from psycopg.errors import PipelineAborted, UniqueViolation

    connection.ensure_connection()
    driver = connection.connection
    event = Event.objects.filter(run=run).first()
    insert = "INSERT INTO orchestrator_event (id, run_id, kind, actor, payload, created_at) " \
             "SELECT id, run_id, kind, actor, payload, created_at FROM orchestrator_event WHERE id = %s"
    driver.autocommit = False
    try:
        with pytest.raises(Exception) as raised:
            with driver.pipeline():
                first, second = driver.cursor(), driver.cursor()
                first.execute(insert, [event.id])
                second.execute("SELECT 1")
        cause = raised.value
        while isinstance(cause, PipelineAborted) and isinstance(cause.__context__, Exception):
            cause = cause.__context__
        assert isinstance(cause, UniqueViolation)
        assert second.pgresult is None
        driver.rollback()
    finally:
        driver.autocommit = True

