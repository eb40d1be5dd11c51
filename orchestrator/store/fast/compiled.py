"""The fast store's statements: built once per model and shape, then sent with new values.

Every transition of a run locks it, reads its steps, saves the steps it moved and appends its
events and their ledger entries. Building those statements through the ORM (querysets, the
SQL compilers, each value prepared through three layers) cost the worker more CPU than the
database spent running them.

- `CompiledRead` keeps what the ORM computed for one queryset: the statement, the converters
  of its columns and how the columns map onto the models that `select_related` joins. Each
  call sends the statement with its own values and builds the instances as
  `QuerySet.__iter__` would. Only filters whose values are plain parameters belong here (no
  expressions, no `IN` lists whose length varies).
- `insert_rows` appends new rows of one model as `bulk_create` does, in one INSERT whose text
  is built once per model and row count.
- `update_row` writes named columns of a saved row as `Model.save(update_fields=...)` does,
  guarded by the row's state where the model is a state machine (django-fsm's optimistic lock).
- `writes_behind` holds the writes whose answer the caller does not read and sends them to
  PostgreSQL together (psycopg's pipeline mode) when an answer is wanted, and `read_together`
  sends reads that do not depend on each other at once.
- `build_row` makes a new instance from keywords as the model's `__init__` would.

Every statement goes out the same way whether or not statements are logged (DEBUG,
`CaptureQueriesContext`): each is appended to the connection's query log as Django's debug
cursor appends it. The private APIs this relies on are listed in docs/architecture.md and
guarded by tests/store/test_internals.py.

None of them may change what the ORM would read or write: `tests/engine/test_compiled.py`
compares each with the ORM's own path. Values are prepared by the fields themselves
(`pre_save`, `get_db_prep_save`), so a field with its own storage (artifacts) stays in charge.
"""
from __future__ import annotations

import json
import time as clock
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from functools import cache
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, models, router
from django.db.models import DEFERRED, NOT_PROVIDED, Model, QuerySet
from django.db.models.base import ModelState
from django.db.models.query import get_related_populators
from django.db.models.signals import post_init, pre_init
from django.db.transaction import TransactionManagementError
from django_fsm import ConcurrentTransitionMixin


@dataclass(frozen=True)
class _Plan:
    sql: str
    arity: int
    model: type[Model]
    init_list: list[str]
    span: slice
    converters: list
    populators: list
    locks: bool
    build: Callable[[str, list, tuple], Model]


class CompiledRead:
    """`build(*placeholders)` once per process and alias, then `rows(*values)` with the values in the
    order the queryset's filters take them.

    The placeholders only have to be of the filters' types: their values are replaced. Compiling
    needs what running the queryset needs (a transaction, for `select_for_update`).
    """

    def __init__(self, build: Callable[..., QuerySet], *placeholders: Any) -> None:
        self._build = build
        self._placeholders = placeholders
        # Per alias, not per connection object: Django makes one per thread (under ASGI, per
        # request), and plans kept per object were compiled again for every request.
        self._plans: dict[tuple[str, str], _Plan] = {}

    def rows(self, *values: Any, using: str = DEFAULT_DB_ALIAS) -> list[Model]:
        """The instances the queryset would give for `values` (already in the database's form:
        `field.get_db_prep_value`, where Python's differs)."""
        connection = connections[using]
        plan = self._checked_plan(connection, using, values)
        fetched, _ = execute(connection, plan.sql, values, fetch=True)
        return _built(plan, using, fetched)

    def _checked_plan(self, connection, using: str, values: tuple) -> _Plan:
        plan = self._plan(connection, using)
        if plan.locks and connection.get_autocommit():
            # What the queryset raises: a row lock outside a transaction is released at once.
            raise TransactionManagementError("select_for_update cannot be used outside of a transaction.")
        if len(values) != plan.arity:
            raise TypeError(f"this read takes {plan.arity} values, {len(values)} given")
        return plan

    def _plan(self, connection, using: str) -> _Plan:
        key = (using, connection.vendor)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._compile(using)
        return plan

    def _compile(self, using: str) -> _Plan:
        queryset = self._build(*self._placeholders)
        compiler = queryset.query.get_compiler(using=using)
        sql, params = compiler.as_sql()
        if compiler.annotation_col_map or compiler.has_extra_select or queryset._prefetch_related_lookups:
            raise ValueError("a compiled read holds model columns only")
        select, klass_info = compiler.select, compiler.klass_info
        first, last = klass_info["select_fields"][0], klass_info["select_fields"][-1] + 1
        fields = [column[0] for column in select[0:compiler.col_count]]
        ops = connections[using].ops
        return _Plan(
            sql=sql, arity=len(params), model=klass_info["model"],
            init_list=[column[0].target.attname for column in select[first:last]],
            span=slice(first, last),
            converters=[(position, [_unbound(convert, ops) for convert in functions], expression)
                        for position, (functions, expression) in compiler.get_converters(fields).items()],
            populators=get_related_populators(klass_info, select, using),
            locks=bool(queryset.query.select_for_update), build=_from_db(klass_info["model"]))


def _unbound(function: Callable, ops) -> tuple[bool, Callable]:
    """(whether it is a method of the connection's operations, the function): a plan keeps no
    connection, so such a method is called with the operations of the connection reading."""
    if getattr(function, "__self__", None) is ops:
        return True, function.__func__
    return False, function


def _built(plan: _Plan, using: str, fetched: list) -> list[Model]:
    """The instances of a read's rows, as `QuerySet.__iter__` builds them."""
    if plan.converters:
        fetched = _converted(fetched, plan.converters, connections[using])
    found = []
    build = plan.build
    for row in fetched:
        obj = build(using, plan.init_list, row[plan.span])
        for populator in plan.populators:
            populator.populate(row, obj)
        found.append(obj)
    return found


def _converted(rows: list, converters: list, connection) -> list[list]:
    """What `SQLCompiler.apply_converters` gives, with this thread's connection."""
    ops = connection.ops
    converted = []
    for row in map(list, rows):
        for position, functions, expression in converters:
            value = row[position]
            for of_ops, convert in functions:
                value = (convert(ops, value, expression, connection) if of_ops
                         else convert(value, expression, connection))
            row[position] = value
        converted.append(row)
    return converted


def read_together(*reads: tuple[CompiledRead, tuple], using: str = DEFAULT_DB_ALIAS) -> list[list[Model]]:
    """The instances of each `(read, values)`, the reads sent together: on PostgreSQL in one
    round trip (psycopg's pipeline mode), elsewhere one after the other.

    The database runs them in the order given, each as a statement of its own: under READ
    COMMITTED each sees what was committed when it started, so a read after a locking read
    sees what the lock's previous holder committed, as when it is sent after the lock is
    granted. Only for reads whose values do not depend on an earlier read's rows.
    """
    connection = connections[using]
    plans = [read._checked_plan(connection, using, values) for read, values in reads]
    behind = _behind_of(connection)
    if behind is not None and behind.pending:
        behind.collect()
    if not (_may_pipeline(connection) and _fast(connection)):
        return [_built(plan, using, execute(connection, plan.sql, values, fetch=True)[0])
                for plan, (_, values) in zip(plans, reads, strict=True)]
    connection.validate_thread_sharing()
    connection.validate_no_broken_transaction()
    kept = _cursors(connection)
    cursors = [kept.take(plan.sql) for plan in plans]
    started = clock.monotonic()
    with connection.wrap_database_errors, connection.connection.pipeline():
        _begin_behind(connection.connection)
        for cursor, plan, (_, values) in zip(cursors, plans, reads, strict=True):
            cursor.execute(plan.sql, values)
    for cursor, plan, (_, values) in zip(cursors, plans, reads, strict=True):
        _log(connection, cursor, plan.sql, values, started)
    found = [_built(plan, using, cursor.fetchall()) for cursor, plan in zip(cursors, plans, strict=True)]
    for cursor, plan in zip(cursors, plans, strict=True):
        kept.give(plan.sql, cursor)
    return found


def _begin_behind(driver) -> None:
    """In a pipeline: if the transaction has not begun on the server, send its BEGIN without
    waiting for it, so that it goes with the statements after it.

    psycopg begins a transaction at its first statement; in a pipeline it sends the BEGIN
    alone and waits for its answer, which cost every transaction a round trip of its own.
    This sends the same BEGIN (`_get_tx_start_command`: isolation level, read only...) the
    way psycopg sends its other commands in a pipeline (`_exec_command`): its answer is read
    with the others', and an error in it fails the pipeline, as it would fail the statement.
    Once it is sent, the driver sees the transaction under way and sends no BEGIN of its own."""
    if not _unbegun(driver) or driver._pipeline is None:
        return
    driver.wait(driver._exec_command(driver._get_tx_start_command()))
    driver.wait(driver._pipeline._communicate_gen())


def _unbegun(driver) -> bool:
    """Whether the driver would send a BEGIN before its next statement."""
    from psycopg.pq import TransactionStatus

    return not driver.autocommit and driver.pgconn.transaction_status == TransactionStatus.IDLE


def _may_pipeline(connection) -> bool:
    """Whether statements may be sent on `connection` without waiting for each answer."""
    return settings.STEPWISE_FAST_STORE["PIPELINE"] and connection.vendor == "postgresql" and _pipelines()


def _fast(connection) -> bool:
    """Whether a statement may go out on the driver's cursor: the connection is open and no
    health check is due (Django's cursor opens it and runs the check)."""
    return not (connection.connection is None
                or (connection.health_check_enabled and not connection.health_check_done))


def _log(connection, cursor, sql: str, params, started: float) -> None:
    """Log a statement sent on a kept cursor as Django's debug cursor logs its own: the query
    log DEBUG and `CaptureQueriesContext` read."""
    if connection.queries_logged:
        try:
            text = connection.ops.last_executed_query(cursor, sql, params) or sql
        except Exception:  # a value the log cannot render: the statement's text is enough
            text = sql
        connection.queries_log.append({"sql": text, "time": "%.3f" % (clock.monotonic() - started)})


def execute(connection, sql: str, params: list, *, fetch: bool = False) -> tuple[list | None, int]:
    """Send one statement: (its rows when `fetch`, else None; the rows it touched).

    Through Django's own cursor when the connection is closed or due its health check; else on a cursor kept for the connection, as Django's cursor would
    send it (the transaction checked first, the driver's errors raised as Django's), without
    building and closing a cursor and its wrappers per statement.
    """
    behind = _behind_of(connection)
    if behind is not None and behind.pending:
        return behind.collect(sql, params, fetch=fetch)
    if not _fast(connection):
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return (cursor.fetchall() if fetch else None), cursor.rowcount
    connection.validate_thread_sharing()
    connection.validate_no_broken_transaction()
    kept = _cursors(connection)
    cursor = kept.take(sql)
    driver = connection.connection
    started = clock.monotonic()
    with connection.wrap_database_errors:
        if _may_pipeline(connection) and _unbegun(driver):
            with driver.pipeline():  # the transaction's BEGIN and this statement together
                _begin_behind(driver)
                cursor.execute(sql, params)
        else:
            cursor.execute(sql, params)
        _log(connection, cursor, sql, params, started)
        answer = (cursor.fetchall() if fetch else None), cursor.rowcount
    kept.give(sql, cursor)
    return answer


# --- writes sent behind ---------------------------------------------------------------------


@contextmanager
def writes_behind(using: str = DEFAULT_DB_ALIAS, *, by: str = "") -> Iterator[None]:
    """Inside a transaction: the writes in this block whose answer the caller does not read go
    to the database without waiting for it, and their answers are collected with the next
    statement that needs one.

    On PostgreSQL (psycopg's pipeline mode), a save (`update_row`), `update_rows(count=False)`
    and `insert_rows(keys=False)` are held in the worker, not waited for. The next statement
    that needs an answer — a read, a write whose result is read, `flush`, any statement Django
    sends itself (the fast engine's cursor flushes first: `orchestrator.store.fast.postgresql`),
    or the end of this block — is sent behind them, all in one
    pipeline (the database is woken once for them, not once per write), and then every answer
    is read in the order sent: a write that failed raises there what it would have
    raised (a database error; `ConcurrentTransition` for a guarded save whose row's state had
    changed; `DatabaseError` for a save whose row is gone, which Django's save would have
    inserted again), and an inserted row gets its key. The database runs the same statements
    in the same order; only the worker learns of their outcome later, and the writes of a
    success cost one round trip instead of one each.

    An INSERT whose only answer is success or a database error (`insert_json_rows`: the
    ledger's entries) may wait longer: when such writes are the last of the block, they are
    held after it, and go with the next statement the transaction sends — its COMMIT, most
    often (`commit_behind`, which the fast engine calls), in the same pipeline. A failure of
    theirs fails that statement, or the COMMIT, as a database error, and the transaction rolls
    back, as if it had been raised at the block's end; a rollback takes them back unsent.

    Writes are held only on the fast engine (`holds_writes`: its cursor and its COMMIT send
    them). Anywhere else every write is answered at once, as without this block: SQLite,
    pipelining off (`STEPWISE_FAST_STORE`), another engine, outside a transaction; a block
    inside another is the outer one's.

    `by` names the service whose writes these are: an error a held write raises says so.
    """
    connection = connections[using]
    behind = _behind_of(connection)
    if behind is not None and behind.in_block:
        yield  # the outer block's
        return
    if behind is None:
        if (not getattr(connection, "holds_writes", False) or not _may_pipeline(connection)
                or not connection.in_atomic_block):
            yield
            return
        behind = connection._stepwise_behind = _Behind(connection)
    if by and not behind.in_block:
        behind.by = by
    # else: writes an earlier block left for the COMMIT; this block's go behind them.
    behind.in_block = True
    try:
        yield
    except BaseException:
        behind.in_block = False
        # Sent before whatever ended the block, so answered now: an error the block raised
        # leaves the transaction as it would have been with every write answered.
        behind.collect()
        raise
    behind.in_block = False
    behind.collect(keep_for_commit=True)


def flush(using: str = DEFAULT_DB_ALIAS) -> None:
    """Send every held write of the connection now and read their answers: what one of them
    raises (a database error, `ConcurrentTransition`) is raised here."""
    flush_on(connections[using])


def flush_on(connection) -> None:
    """`flush` for a connection in hand (the fast engine's cursors)."""
    behind = _behind_of(connection)
    if behind is not None and behind.pending:
        behind.collect()


def commit_behind(connection) -> bool:
    """COMMIT with the writes a `writes_behind` block left for it, in one pipeline: True when
    it did; False when the caller is to commit as usual (none waiting, or a driver that cannot
    send the COMMIT in a pipeline: the writes are sent first)."""
    behind = _behind_of(connection)
    if behind is None:
        return False
    if not behind.pending or connection.connection is None:
        behind.end()
        return False
    behind.collect(commit=True)
    return True


def forget_behind(connection) -> None:
    """At a rollback or a close: the writes left for the COMMIT are not sent."""
    behind = _behind_of(connection)
    if behind is not None:
        behind.pending = []
        behind.end()


def _sending_behind(connection) -> _Behind | None:
    """The `writes_behind` block a write may be held by: an open one (writes left for the
    COMMIT are sent with the next statement, this write included)."""
    behind = _behind_of(connection)
    return behind if behind is not None and behind.in_block else None


def _behind_of(connection) -> _Behind | None:
    return getattr(connection, "_stepwise_behind", None)


@cache
def _pipelines() -> bool:
    """Whether the PostgreSQL driver can send statements without waiting (libpq >= 14)."""
    from psycopg import Pipeline

    return Pipeline.is_supported()


class _Behind:
    """The writes of one `writes_behind` block not yet sent, sent together on their
    connection's pipeline when an answer is wanted (`collect`). After the block, it holds
    the writes left for the COMMIT, if any, until they are sent or forgotten (`end`)."""

    def __init__(self, connection) -> None:
        self.connection = connection
        # (statement, values, how its answer is read, whether it may wait for the COMMIT)
        self.pending: list[tuple[str, list, Callable[[Any], None], bool]] = []
        self.in_block = False
        self.by = ""  # the service whose writes are held (`writes_behind(by=...)`)

    def send(self, sql: str, params: list, then: Callable[[Any], None], *, to_commit: bool = False) -> None:
        """Hold a write until an answer is wanted; `then(cursor)` reads its answer then (raises
        for a failure). `to_commit`: its answer is nothing but success or a database error, so
        it may wait for the COMMIT (`writes_behind`)."""
        connection = self.connection
        connection.validate_thread_sharing()
        connection.validate_no_broken_transaction()
        self.pending.append((sql, _as_now(params), then, to_commit))

    def end(self) -> None:
        """No longer between the connection and its statements."""
        connection = self.connection
        if _behind_of(connection) is self:
            connection._stepwise_behind = None

    def collect(self, sql: str | None = None, params: list | None = None, *,
                fetch: bool = False, keep_for_commit: bool = False,
                commit: bool = False) -> tuple[list | None, int]:
        """Send `sql` (if any) behind the pending writes, wait for every answer and read them in
        order; `sql`'s rows (when `fetch`) and row count, as `execute` gives them.
        `keep_for_commit`: the last writes that may wait for the COMMIT are kept, not sent.
        `commit`: the transaction's COMMIT is sent behind them."""
        queued, kept_back = self.pending, []
        if keep_for_commit:
            while queued and queued[-1][3]:
                kept_back.insert(0, queued.pop())
        self.pending = kept_back
        try:
            if not queued and not commit:
                return (None, -1) if sql is None else execute(self.connection, sql, params, fetch=fetch)
            try:
                return self._send(queued, sql, params, fetch=fetch, commit=commit)
            except Exception as error:
                if self.by:
                    error.add_note(f"raised by a write {self.by} held (orchestrator.store.held_writes)")
                raise
        finally:
            if not self.in_block and not self.pending:
                self.end()

    def _send(self, queued: list, sql: str | None, params: list | None, *, fetch: bool,
              commit: bool) -> tuple[list | None, int]:
        connection, pending = self.connection, []
        kept = _cursors(connection)
        last = None
        started = clock.monotonic()
        with connection.wrap_database_errors:
            driver = connection.connection
            pipeline = driver.pipeline()
            pipeline.__enter__()
            try:
                _begin_behind(driver)
                for queued_sql, queued_params, then, _ in queued:
                    cursor = kept.take(queued_sql)
                    pending.append((cursor, then))
                    cursor.execute(queued_sql, queued_params)
                if sql is not None:
                    last = kept.take(sql)
                    last.execute(sql, params)
                if commit:  # as psycopg sends it, answered with the others
                    driver.wait(driver._exec_command(b"COMMIT"))
            finally:
                try:
                    pipeline.__exit__(None, None, None)  # sync: every answer read, the first error raised
                except Exception as error:
                    _raise_first_in_order(pending)
                    raise _refusal(error) from None
        for (cursor, _), (queued_sql, queued_params, _, _) in zip(pending, queued, strict=True):
            _log(connection, cursor, queued_sql, queued_params, started)
        if last is not None:
            _log(connection, last, sql, params, started)
        if commit and connection.queries_logged:
            connection.queries_log.append({"sql": "COMMIT", "time": "%.3f" % (clock.monotonic() - started)})
        for (cursor, then), (queued_sql, _, _, _) in zip(pending, queued, strict=True):
            then(cursor)
            kept.give(queued_sql, cursor)
        if last is None:
            return None, -1
        answer = (last.fetchall() if fetch else None), last.rowcount
        kept.give(sql, last)
        return answer


def _as_now(params: list) -> list:
    """`params` with each JSON value (psycopg's wrapper of a dict or a list) encoded now: a
    write held until an answer is wanted sends the value it was given, whatever becomes of
    the object in between, as a write sent at once did."""
    wrapper = _json_wrapper()
    if not any(isinstance(value, wrapper) for value in params):
        return params
    return [type(value)(_encoded(value), dumps=_as_is) if isinstance(value, wrapper) else value
            for value in params]


@cache
def _json_wrapper() -> tuple[type, ...]:
    from psycopg.types.json import Json, Jsonb

    return Json, Jsonb


def _encoded(value) -> str:
    return value.dumps(value.obj) if value.dumps is not None else json.dumps(value.obj)


def _as_is(text: str) -> str:
    return text


def _refusal(error: Exception) -> Exception:
    """The statement's own error behind psycopg's `PipelineAborted`: the pipeline's exit reads
    the answers left after the first error in a `finally`, whose "aborted" then replaces it."""
    from psycopg.errors import PipelineAborted

    cause = error
    while isinstance(cause, PipelineAborted) and isinstance(cause.__context__, Exception):
        cause = cause.__context__
    return cause


def _raise_first_in_order(pending: list[tuple[Any, Callable[[Any], None]]]) -> None:
    """The database refused a statement of the pipeline: a write answered before it may have
    failed first, with no error of the database's (a guarded save whose row moved: no row
    updated). Raise that one, as the statements sent one by one would have."""
    for cursor, then in pending:
        if cursor.pgresult is None:  # the refused statement, or one after it: not answered
            return
        then(cursor)


class _Cursors:
    """The driver cursors kept for one open connection, by the statement they send.

    A statement sent in a pipeline needs a cursor of its own, which keeps its answer until it
    is read. A cursor that sends the same statement again keeps psycopg's adapters for its
    values and columns (the driver makes new ones whenever a cursor's statement changes), so
    each statement is given back the cursor it used last. At most `KEPT` statements keep
    cursors; the others are sent on new ones."""

    KEPT = 256

    def __init__(self, connection) -> None:
        self.connection = connection
        self.kept: dict[str, list] = {}

    def take(self, sql: str):
        free = self.kept.get(sql)
        return free.pop() if free else self.connection.create_cursor()

    def give(self, sql: str, cursor) -> None:
        free = self.kept.get(sql)
        if free is None:
            if len(self.kept) >= self.KEPT:
                return
            free = self.kept[sql] = []
        free.append(cursor)


def _cursors(connection) -> _Cursors:
    return _of_open_connection(connection, "_stepwise_cursors", lambda: _Cursors(connection))


def _of_open_connection(connection, name: str, make: Callable[[], Any]) -> Any:
    """What `make()` gave for the driver connection now open, kept on Django's connection
    under `name` (made again after a reconnect: a cursor belongs to its driver connection)."""
    kept = getattr(connection, name, None)
    if kept is None or kept[0] is not connection.connection:
        kept = (connection.connection, make())
        setattr(connection, name, kept)
    return kept[1]


def _from_db(model: type[Model]) -> Callable[[str, list, tuple], Model]:
    """`model.from_db`, or what it does without Django's generic `__init__` (which sets each
    field through its descriptor and looks for signal receivers), where that is the same:
    nothing listens to the model's init signals and its `__init__` is Django's, or django-fsm's
    (which then notes the state the row was read in). The columns not loaded stay absent from
    the instance, deferred, as `from_db` leaves them. A state machine's row also keeps the
    values it was read with, so that its whole save writes only what changed (`update_row`)."""
    fsm = issubclass(model, ConcurrentTransitionMixin)
    if (pre_init.has_listeners(model) or post_init.has_listeners(model)
            or model.__init__ not in (Model.__init__, ConcurrentTransitionMixin.__init__)):
        return model.from_db
    new = model.__new__

    def build(using: str, names: list, values: tuple) -> Model:
        obj = new(model)
        state = obj._state = ModelState()
        state.adding, state.db = False, using
        loaded = dict(zip(names, values, strict=True))
        obj.__dict__.update(loaded)
        if fsm:
            obj._update_initial_state()
            _remember_loaded(obj, loaded)
        return obj

    return build


def build_row(model: type[Model], /, **kwargs: Any) -> Model:
    """A new, unsaved `model(**kwargs)` built as Django's `__init__` builds it, without its
    walk through every field: each value given, or the field's default, goes into the
    instance as Django's descriptors would put it; a related instance is still set through
    its descriptor (its checks and cache).

    Django's own `__init__` builds it where anything could differ: a name that is not a field
    (it raises), DEFERRED, init-signal receivers, database routers, a field with a descriptor
    of its own, a model whose `__init__` is not Django's.
    """
    plan = _keyword_plan(model)
    if plan is None or not plan.takes(kwargs):
        return model(**kwargs)
    obj = model.__new__(model)
    obj._state = ModelState()
    values = obj.__dict__
    for attname, default, call in plan.plain:
        values[attname] = kwargs[attname] if attname in kwargs else default() if call else default
    for name, attname, default in plan.related:
        if name in kwargs:
            setattr(obj, name, kwargs[name])  # the descriptor: type, database, cache
        else:
            values[attname] = kwargs.get(attname, default)
    return obj


@dataclass(frozen=True)
class _KeywordPlan:
    plain: tuple[tuple[str, Any, bool], ...]    # attname, default (or what makes it), call it
    related: tuple[tuple[str, str, Any], ...]   # name, attname, default
    names: frozenset[str]

    def takes(self, kwargs: dict) -> bool:
        return (kwargs.keys() <= self.names
                and not any(name in kwargs and attname in kwargs for name, attname, _ in self.related)
                and not any(value is DEFERRED for value in kwargs.values())
                and not (pre_init.receivers or post_init.receivers or router.routers))


@cache
def _keyword_plan(model: type[Model]) -> _KeywordPlan | None:
    from django.db.models.fields.related_descriptors import ForeignKeyDeferredAttribute
    from django.db.models.query_utils import DeferredAttribute

    plain, related, plan = [], [], None
    if model.__init__ is not Model.__init__:
        return None  # a model with its own construction (django-fsm's notes its state)
    opts = model._meta
    for field in opts.fields:
        descriptor = type(model.__dict__.get(field.attname))
        if field.column is None or field.generated or not field.concrete:
            break
        if (field.many_to_one and descriptor is ForeignKeyDeferredAttribute
                and not (field.has_default() and callable(field.default))):
            related.append((field.name, field.attname, field.get_default()))
        elif not field.is_relation and descriptor is DeferredAttribute:
            call = field.has_default() and callable(field.default)
            plain.append((field.attname, field.default if call else field.get_default(), call))
        else:
            break
    else:
        plan = _KeywordPlan(plain=tuple(plain), related=tuple(related),
                            names=frozenset([p[0] for p in plain] + [n for r in related for n in r[:2]]))
    return plan


# --- writes ---------------------------------------------------------------------------------

# Larger batches (a map's fan-out) go through `bulk_create`, which splits them to the
# database's limit on parameters; a statement per row count up to here is kept.
MAX_COMPILED_ROWS = 16


def insert_rows(objs: list[Model], *, using: str = DEFAULT_DB_ALIAS, keys: bool = True) -> None:
    """Insert `objs`, new instances of one model, in one statement, and give each the key the
    database made for it (where it makes them): what `Model.objects.bulk_create(objs)` does.

    `keys=False`: the caller reads none of the new keys now, so in a `writes_behind` block the
    INSERT is sent behind and the rows get their keys when its answer is read."""
    if not objs:
        return
    model = type(objs[0])
    connection = connections[using]
    plan = None
    if len(objs) <= MAX_COMPILED_ROWS and connection.features.can_return_rows_from_bulk_insert:
        plan = _insert_plan(model, connection, len(objs))
    if plan is None:
        model._base_manager.using(using).bulk_create(objs)
        return
    sql, fields, returns_key = plan
    pk = model._meta.pk
    values = []
    preparers = _preparers(fields, connection)
    for obj in objs:
        if not returns_key and not obj._is_pk_set():
            obj.pk = pk.get_pk_value_on_save(obj)
        obj._prepare_related_fields_for_save(operation_name="bulk_create")
        values.extend([prepare(obj, True, connection) for prepare in preparers])
    behind = None if keys else _sending_behind(connection)
    if behind is not None:
        behind.send(sql, values, lambda cursor: returns_key and _set_keys(objs, cursor.fetchall()))
    else:
        made, _ = execute(connection, sql, values, fetch=returns_key)
        if made is not None:
            _set_keys(objs, made)
    for obj in objs:
        obj._state.adding = False
        obj._state.db = using
        if hasattr(obj, "_update_initial_state"):
            obj._update_initial_state()  # a state machine's next save is guarded by this state


def insert_json_rows(model: type[Model], rows: list[dict], *, using: str = DEFAULT_DB_ALIAS) -> bool:
    """On PostgreSQL, insert `rows` of `model` in one INSERT with one parameter, the rows as a
    JSON array, and return True; elsewhere return False (the caller inserts instances).

    Each row maps every column but the automatic key to its value as JSON gives it and the
    column's type reads it (timestamps and UUIDs as text). The new keys are not read, so in a
    `writes_behind` block the INSERT is sent behind. For many columns of plain values (the
    ledger's entries: 25 each) this costs the worker a JSON encoding instead of preparing
    and sending every value on its own."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return False
    sql, columns = _json_insert_plan(model, connection)
    if not columns <= rows[0].keys():
        raise ValueError(f"rows of {model.__name__} lack {sorted(columns - rows[0].keys())}")
    params = [json.dumps(rows, separators=(",", ":"))]
    behind = _sending_behind(connection)
    if behind is not None:
        behind.send(sql, params, _no_answer, to_commit=True)
    else:
        execute(connection, sql, params)
    return True


# By model only: Django makes a connection object per thread (under ASGI, per request), and
# a cache keyed by it would keep every one alive, with its cursors.
_JSON_INSERTS: dict[type[Model], tuple[str, frozenset[str]]] = {}


def _json_insert_plan(model: type[Model], connection) -> tuple[str, frozenset[str]]:
    if model not in _JSON_INSERTS:
        _JSON_INSERTS[model] = _build_json_insert(model, connection)
    return _JSON_INSERTS[model]


def _build_json_insert(model: type[Model], connection) -> tuple[str, frozenset[str]]:
    opts, quote = model._meta, connection.ops.quote_name
    columns = [f.column for f in opts.concrete_fields if not f.primary_key]
    listed = ", ".join(quote(c) for c in columns)
    table = quote(opts.db_table)
    return (f"INSERT INTO {table} ({listed}) SELECT {listed} "
            f"FROM json_populate_recordset(NULL::{table}, %s::json)", frozenset(columns))


def _no_answer(cursor) -> None:
    """The answer of a write whose only answer is success (a failure raised as it is read)."""


def _set_keys(objs: list[Model], made: list[tuple]) -> None:
    attname = objs[0]._meta.pk.attname
    for obj, row in zip(objs, made, strict=True):
        setattr(obj, attname, row[0])


_INSERTS: dict[tuple, tuple[str, list, bool] | None] = {}


def _insert_plan(model: type[Model], connection, rows: int) -> tuple[str, list, bool] | None:
    key = (model, connection.vendor, rows)
    if key not in _INSERTS:
        _INSERTS[key] = _build_insert(model, connection, rows)
    return _INSERTS[key]


def _build_insert(model: type[Model], connection, rows: int) -> tuple[str, list, bool] | None:
    """(statement, fields, whether it returns the keys), or None for a model this path does
    not cover (the ORM's then): columns the database fills itself besides an automatic key, a
    field with its own placeholder."""
    opts = model._meta
    returning = [f.attname for f in opts.db_returning_fields]
    returns_key = returning == [opts.pk.attname]
    if returning and not returns_key:
        return None
    fields = [f for f in opts.concrete_fields if not (returns_key and f.primary_key)]
    if any(f.generated or f.db_default is not NOT_PROVIDED or hasattr(f, "get_placeholder")
           for f in fields):
        return None
    quote = connection.ops.quote_name
    row = "(" + ", ".join(["%s"] * len(fields)) + ")"
    sql = (f"INSERT INTO {quote(opts.db_table)} ({', '.join(quote(f.column) for f in fields)}) "
           f"VALUES {', '.join([row] * rows)}")
    if returns_key:
        sql += f" RETURNING {quote(opts.db_table)}.{quote(opts.pk.column)}"
    return sql, fields, returns_key


# By the fields' list (a plan's, kept as long as the plan: found by identity, since hashing
# its fields cost more than preparing their values) and the alias; shared by the process's
# threads, as the plans are, so they keep no connection: each call is given the one writing.
_PREPARERS: dict[tuple[int, str], tuple[list, list]] = {}


def _preparers(fields: list, connection) -> list[Callable[[Model, bool, Any], Any]]:
    """One function per field, `prepare(obj, add, connection)`, giving an instance's value as
    the database takes it."""
    key = (id(fields), connection.alias)
    found = _PREPARERS.get(key)
    if found is None or found[0] is not fields:
        found = _PREPARERS[key] = (fields, [_preparer(field, connection) for field in fields])
    return found[1]


def _preparer(field, connection) -> Callable[[Model, bool, Any], Any]:
    def prepare(obj: Model, add: bool, connection) -> Any:
        return field.get_db_prep_save(field.pre_save(obj, add), connection)

    shortcut = _shortcut(field, connection)
    if shortcut is None:
        return prepare
    attname = field.attname

    def quick(obj: Model, add: bool, connection) -> Any:
        value = shortcut(getattr(obj, attname), connection.ops)
        return prepare(obj, add, connection) if value is _SLOW else value

    return quick


# What a shortcut gives for a value it does not cover: the field's own three calls then.
_SLOW = object()

# Exact classes only: a subclass may prepare values its own way. Their `pre_save` reads the
# attribute (a DateTimeField's too, unless it sets itself: auto_now, auto_now_add).
_TEXT_FIELDS = frozenset({models.CharField, models.TextField, models.SlugField})
_INTEGER_FIELDS = frozenset({models.IntegerField, models.BigIntegerField, models.SmallIntegerField,
                             models.PositiveIntegerField, models.PositiveBigIntegerField,
                             models.PositiveSmallIntegerField})
_AUTO_FIELDS = frozenset({models.AutoField, models.BigAutoField, models.SmallAutoField})


def _shortcut(field, connection) -> Callable[[Any, Any], Any] | None:
    """`shortcut(value, ops)`: `field.get_db_prep_save` for the value types the engine writes,
    in one call (the last step of Django's own chain: `get_prep_value` is the identity for
    these types), or _SLOW; `ops` is the writing connection's operations.
    `tests/engine/test_compiled.py` compares every shortcut with the field's own chain."""
    kind, operations = type(field), type(connection.ops)
    if kind is models.ForeignKey and type(field.target_field) in (*_AUTO_FIELDS, models.UUIDField):
        target = _shortcut(field.target_field, connection)
        return lambda value, ops: None if value is None else target(value, ops)
    if kind in _TEXT_FIELDS:
        return lambda value, ops: value if value is None or type(value) is str else _SLOW
    if kind in _INTEGER_FIELDS:
        adapt, internal_type = operations.adapt_integerfield_value, field.get_internal_type()
        return lambda value, ops: (adapt(ops, value, internal_type) if value is None or type(value) is int
                                   else _SLOW)
    if kind in _AUTO_FIELDS:
        validate = operations.validate_autopk_value
        return lambda value, ops: validate(ops, value) if type(value) is int else _SLOW
    if kind is models.UUIDField:
        native = connection.features.has_native_uuid_field
        return lambda value, ops: (
            None if value is None else (value if native else value.hex) if type(value) is UUID else _SLOW)
    if kind is models.DateTimeField and not (field.auto_now or field.auto_now_add):
        adapt = operations.adapt_datetimefield_value
        return lambda value, ops: (adapt(ops, value) if value is None
                                   or (type(value) is datetime and value.tzinfo is UTC) else _SLOW)
    if kind is models.BooleanField:
        return lambda value, ops: value if type(value) is bool else _SLOW
    return None


def update_row(obj: Model, fields: tuple[str, ...] | None = None, *, using: str | None = None) -> bool:
    """Write `fields` of saved `obj` (every loaded field when None) with one UPDATE, as
    `obj.save()` does; False when no row has its key. Of a row a compiled read built, a whole
    save writes the columns whose values changed since it was read or last written (dicts and
    lists, which change in place, always): what `obj.save()` leaves in the row is the same.

    A state machine's row (django-fsm's `ConcurrentTransitionMixin`) is written only while
    its state is still the one it was read in: `ConcurrentTransition` is raised otherwise, as
    the mixin does.

    In a `writes_behind` block the UPDATE is sent behind and True returned: what it would have
    raised is raised when its answer is read, and a row found gone raises `DatabaseError`.
    """
    using = using or obj._state.db or DEFAULT_DB_ALIAS
    connection = connections[using]
    model = type(obj)
    loaded = _loaded_of(obj)
    guarded = isinstance(obj, ConcurrentTransitionMixin)
    if fields is None:
        deferred = obj.get_deferred_fields()
        fields = tuple(f.attname for f in model._meta.concrete_fields
                       if not f.primary_key and f.attname not in deferred)
        if loaded is not None:
            fields = _changed_since_read(obj, fields, loaded)
    sql, columns, guards = _update_plan(model, connection, tuple(fields), guarded)
    obj._prepare_related_fields_for_save(operation_name="save")
    values = [prepare(obj, False, connection) for prepare in _preparers(columns, connection)]
    values.append(model._meta.pk.get_db_prep_value(obj.pk, connection))
    if guards:
        initial = obj._ConcurrentTransitionMixin__initial_states
        values.extend(field.get_db_prep_value(initial[field.attname], connection) for field in guards)
    behind = _sending_behind(connection)
    if behind is not None:
        behind.send(sql, values, lambda cursor: _saved_behind(cursor, model, obj.pk, guards, using))
        updated = True
    else:
        updated = execute(connection, sql, values)[1] > 0
        if not updated and guards:
            _not_saved(model, obj.pk, guards, using, gone=False)
    if updated and guarded:
        obj._update_initial_state()
    if loaded is not None and updated:
        # What the row now holds: a column set back to what it was read with is written.
        current = obj.__dict__
        _remember_loaded(obj, {**loaded, **{f.attname: current[f.attname] for f in columns}})
    return updated


def _remember_loaded(obj: Model, loaded: dict) -> None:
    """Keep what the row holds beside the state django-fsm noted with it: Django's own save
    and `refresh_from_db` note the state anew (a new dict), which makes this record stale."""
    obj._state.stepwise_loaded = (obj._ConcurrentTransitionMixin__initial_states, loaded)


def _loaded_of(obj: Model) -> dict | None:
    """What the row held when this store last read or wrote it, if nothing wrote or read it
    since (else None: a whole save then writes every column)."""
    kept = getattr(obj._state, "stepwise_loaded", None)
    if kept is None or kept[0] is not getattr(obj, "_ConcurrentTransitionMixin__initial_states", None):
        return None
    return kept[1]


def _saved_behind(cursor, model: type[Model], pk: Any, guards: list, using: str) -> None:
    """The answer of a save sent behind: nothing when it updated its row, else what
    `_not_saved` raises. Read after a later statement of its pipeline was refused, the failed
    transaction cannot be asked whether the row is there (`look=False`)."""
    from psycopg.pq import TransactionStatus

    if cursor.rowcount <= 0:
        _not_saved(model, pk, guards, using,
                   look=cursor.connection.info.transaction_status != TransactionStatus.INERROR)


def _not_saved(model: type[Model], pk: Any, guards: list, using: str, *, gone: bool = True,
               look: bool = True) -> None:
    """A save matched no row: `ConcurrentTransition` when the row is there (its state is not the
    one it was read in); else, with `gone`, `DatabaseError` (without it the caller decides:
    Django's save inserts the row again). Without `look` (a failed transaction: no statement
    can ask), a guarded row is not in the state it was read in either way: `ConcurrentTransition`."""
    from django.db import DatabaseError
    from django_fsm import ConcurrentTransition

    if guards and (not look or model._base_manager.using(using).filter(pk=pk).exists()):
        raise ConcurrentTransition(
            "Cannot save object! The state has been changed since fetched from the database!")
    if gone:
        raise DatabaseError(f"{model._meta.label} {pk} was saved but no longer exists")


# Values compared by equality: whatever holds them cannot have changed them in place. A JSON
# column's dict or list can, so it is always written.
_IMMUTABLE = frozenset({type(None), bool, int, float, Decimal, str, bytes, datetime, date, time,
                        timedelta, UUID})


def _changed_since_read(obj: Model, fields: tuple[str, ...], loaded: dict) -> tuple[str, ...]:
    """Of a whole save's `fields`, those whose value may differ from the one the row was
    read with (every column when none did: the save still checks the row and its state)."""
    current, absent = obj.__dict__, object()
    changed = tuple(name for name in fields if not (
        type(value := current[name]) in _IMMUTABLE
        and type(value) is type(before := loaded.get(name, absent)) and value == before))
    return changed or fields


_UPDATES: dict[tuple, tuple[str, list, list]] = {}


def _update_plan(model: type[Model], connection, fields: tuple[str, ...], guarded: bool):
    key = (model, connection.vendor, fields, guarded)
    plan = _UPDATES.get(key)
    if plan is None:
        from django_fsm import FSMFieldMixin

        quote = connection.ops.quote_name
        opts = model._meta
        columns = [opts.get_field(name) for name in fields]
        guards = [f for f in opts.concrete_fields if guarded and isinstance(f, FSMFieldMixin)]
        where = " AND ".join([f"{quote(opts.pk.column)} = %s", *(f"{quote(f.column)} = %s" for f in guards)])
        sql = (f"UPDATE {quote(opts.db_table)} SET "
               f"{', '.join(f'{quote(f.column)} = %s' for f in columns)} WHERE {where}")
        plan = _UPDATES[key] = (sql, columns, guards)
    return plan


def update_rows(model: type[Model], *, where: dict[str, Any], values: dict[str, Any],
                using: str = DEFAULT_DB_ALIAS, count: bool = True) -> int | None:
    """`model.objects.filter(**where).update(**values)` for plain values and equality filters
    on the model's own columns, with the statement built once per set of names; the number
    of rows written (None with `count=False`: then, in a `writes_behind` block, it is sent
    behind)."""
    connection = connections[using]
    key = (model, connection.vendor, tuple(where), tuple(values))
    plan = _FILTERED_UPDATES.get(key)
    if plan is None:
        quote = connection.ops.quote_name
        opts = model._meta
        columns = [opts.get_field(name) for name in values]
        filters = [opts.get_field(name) for name in where]
        sql = (f"UPDATE {quote(opts.db_table)} SET "
               f"{', '.join(f'{quote(f.column)} = %s' for f in columns)} "
               f"WHERE {' AND '.join(f'{quote(f.column)} = %s' for f in filters)}")
        plan = _FILTERED_UPDATES[key] = (sql, columns, filters)
    sql, columns, filters = plan
    params = [field.get_db_prep_save(value, connection) for field, value in zip(columns, values.values(), strict=True)]
    params.extend(_db_key(field, value, connection) for field, value in zip(filters, where.values(), strict=True))
    behind = None if count else _sending_behind(connection)
    if behind is not None:
        behind.send(sql, params, _no_answer)
        return None
    written = execute(connection, sql, params)[1]
    return written if count else None


_FILTERED_UPDATES: dict[tuple, tuple[str, list, list]] = {}


def _db_key(field, value, connection):
    """A filter's value as the database compares it (a related instance by its key)."""
    if isinstance(value, Model):
        value = value.pk
    target = field.target_field if field.is_relation else field
    return target.get_db_prep_value(value, connection)
