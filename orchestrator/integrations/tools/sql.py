"""SQL tools: `sql.query` (read-only) and `sql.execute` (writes) on a named `sql` connection.

Statements are parameterized only: the statement is literal text in the definition (a template
in it is refused when the definition is saved) and values travel separately in `args`, bound as
`:name` placeholders by SQLAlchemy Core on psycopg 3 (PostgreSQL), PyMySQL (MariaDB/MySQL) or
sqlite3 — so nothing a model or a run input says is ever spliced into SQL.

* `sql.query` runs in a read-only transaction (`SET TRANSACTION READ ONLY`; SQLite's
  `query_only`), whatever the connection allows, and returns at most `max_rows` rows.
* `sql.execute` needs a connection with `writes: true`. It is exactly-once in the target
  database: the step's idempotency key is inserted into the connection's idempotency table
  (default `stepwise_effects`) in the same transaction as the write, with the result. A repeat
  of the key - a retry after a worker died mid-call, a redrive - finds the row and returns
  the stored result without writing again; a concurrent attempt waits on the key's row and
  then does the same. So the tool `dedupes_by_key`.
* On SQLite an authorizer refuses what reaches past the one database file: ATTACH (and VACUUM
  INTO, which attaches), DETACH, `load_extension` and other file or pointer functions, and
  every pragma outside a read-only list (`SQLITE_PRAGMAS`), `query_only` included.
* Both end by the step's time limit: a server-side statement timeout (PostgreSQL
  `statement_timeout`, MariaDB `max_statement_time`, MySQL `max_execution_time`) and, for
  SQLite, an interrupt from the progress handler.

Errors are classified for the retry policy by SQLSTATE / server error code (`classify`).

SQLAlchemy is imported by the functions that use it, not with the module: every process loads
the tools, and most never run a SQL step.
"""
from __future__ import annotations

import json
import sqlite3
import threading
import time
from base64 import b64encode
from datetime import date, datetime, timedelta
from datetime import time as dtime
from decimal import Decimal
from typing import TYPE_CHECKING
from uuid import UUID

from orchestrator.engine.hashing import digest_of
from orchestrator.engine.retry import StepError

from ..connections import Connection
from .named import CONNECTION_PARAM, connection_checked, connection_for, deadline_s, failure
from .registry import ToolContext, tool

if TYPE_CHECKING:
    import sqlalchemy as sa
    from sqlalchemy.engine import URL, Engine
    from sqlalchemy.engine import Connection as SAConnection

DEFAULT_MAX_ROWS = 1000
MAX_BATCH = 1000
IDEMPOTENCY_TABLE = "stepwise_effects"

_ARG = {"type": ["string", "number", "integer", "boolean", "null"]}
_ARGS = {"type": "object", "additionalProperties": _ARG, "maxProperties": 100,
         "description": "Values for the statement's :name placeholders."}
_STATEMENT = {"type": "string", "minLength": 1, "maxLength": 20000,
              "description": "One SQL statement, literal, with :name placeholders."}
QUERY_PARAMS = {
    "type": "object", "additionalProperties": False, "required": ["connection", "statement"],
    "properties": {
        "connection": CONNECTION_PARAM,
        "statement": _STATEMENT,
        "args": _ARGS,
        "max_rows": {"type": "integer", "minimum": 1,
                     "description": "At most this many rows (and never more than the "
                                    "connection's max_rows)."},
        "timeout_s": {"type": "number", "exclusiveMinimum": 0, "default": 30},
    },
}
EXECUTE_PARAMS = {
    "type": "object", "additionalProperties": False, "required": ["connection", "statement"],
    "properties": {
        "connection": CONNECTION_PARAM,
        "statement": _STATEMENT,
        "args": {"oneOf": [_ARGS, {"type": "array", "items": _ARGS, "minItems": 1,
                                   "maxItems": MAX_BATCH}],
                 "description": "Values for the placeholders; a list runs the statement once "
                                "per item, in the same transaction."},
        "max_rows": {"type": "integer", "minimum": 1},
        "timeout_s": {"type": "number", "exclusiveMinimum": 0, "default": 30},
    },
}
_ROWS = {"type": "array", "items": {"type": "object"}}
QUERY_OUTPUT = {
    "type": "object", "required": ["columns", "rows", "row_count", "truncated"],
    "properties": {"columns": {"type": "array", "items": {"type": "string"}}, "rows": _ROWS,
                   "row_count": {"type": "integer"}, "truncated": {"type": "boolean"}},
}
EXECUTE_OUTPUT = {
    "type": "object", "required": ["row_count", "columns", "rows"],
    "properties": {"row_count": {"type": "integer"},
                   "columns": {"type": "array", "items": {"type": "string"}},
                   "rows": _ROWS},
}

# Pragmas that only read the schema or the database's metadata; any other (writable_schema,
# temp_store_directory, journal_mode ...) changes the file or the process and is refused.
SQLITE_PRAGMAS = frozenset({
    "table_info", "table_xinfo", "table_list", "index_list", "index_info",
    "index_xinfo", "foreign_key_list", "foreign_key_check", "database_list", "collation_list",
    "function_list", "pragma_list", "module_list", "compile_options", "user_version",
    "schema_version", "application_id", "page_count", "page_size", "freelist_count", "encoding",
    "integrity_check", "quick_check", "data_version"})
# Functions that load code or touch files and pointers (some only exist when an extension is
# loaded, which this refuses too).
SQLITE_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer", "readfile", "writefile", "edit"})
_refusal = threading.local()


def _sqlite_authorizer(action, arg1, arg2, db_name, trigger):
    """sqlite3's authorizer: deny what would reach outside the connection's one file."""
    refused = None
    if action == sqlite3.SQLITE_ATTACH:
        refused = f"ATTACH (or VACUUM INTO) {arg1!r}"
    elif action == sqlite3.SQLITE_DETACH:
        refused = "DETACH"
    elif action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() not in SQLITE_PRAGMAS:
        refused = f"PRAGMA {arg1}"
    elif action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in SQLITE_FUNCTIONS:
        refused = f"the function {arg2}()"
    if refused is None:
        return sqlite3.SQLITE_OK
    _refusal.text = refused
    return sqlite3.SQLITE_DENY


def _guard(conn: SAConnection) -> None:
    """From here on, the step's own statement: on SQLite the authorizer decides what it may
    touch (SQLAlchemy's and our own pragmas ran before; the file is closed after the call)."""
    if conn.dialect.name == "sqlite":
        _refusal.text = None
        conn.connection.dbapi_connection.set_authorizer(_sqlite_authorizer)


_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


# --- connections ----------------------------------------------------------------------------

def _url(connection: Connection) -> URL:
    from sqlalchemy.engine import make_url

    url = make_url(connection.secret("url"))
    backend = url.get_backend_name()
    if backend in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    elif backend in ("mysql", "mariadb"):
        url = url.set(drivername="mysql+pymysql")
    elif backend != "sqlite":
        raise StepError("policy", f"connection '{connection.name}': unsupported database {backend}")
    password = connection.secret("password")
    return url.set(password=password) if password is not None else url


def engine_for(connection: Connection) -> Engine:
    """One engine (and connection pool) per connection configuration in this process."""
    import sqlalchemy as sa
    from sqlalchemy.pool import NullPool

    url = _url(connection)
    key = digest_of({"name": connection.name, "url": url.render_as_string(hide_password=False),
                     "timeout": connection.get("timeout_s")})
    with _engines_lock:
        engine = _engines.get(key)
        if engine is None:
            timeout = float(connection.get("timeout_s") or 30)
            backend = url.get_backend_name()
            if backend == "sqlite":
                # A file opened per call: cheap, and no pooled connection keeps a pragma.
                engine = sa.create_engine(url, poolclass=NullPool,
                                          connect_args={"timeout": min(timeout, 10)})
            elif backend == "mysql":
                engine = sa.create_engine(url, pool_pre_ping=True, pool_size=2, max_overflow=2,
                                          connect_args={"connect_timeout": min(timeout, 10),
                                                        "read_timeout": int(timeout) + 5,
                                                        "write_timeout": int(timeout) + 5})
            else:
                engine = sa.create_engine(url, pool_pre_ping=True, pool_size=2, max_overflow=2,
                                          connect_args={"connect_timeout": int(min(timeout, 10))})
            _engines[key] = engine
    return engine


def _limit_time(conn: SAConnection, seconds: float) -> None:
    """A server-side bound on each statement of this transaction (and SQLite's interrupt)."""
    dialect = conn.dialect.name
    if dialect == "postgresql":
        conn.exec_driver_sql(f"SET LOCAL statement_timeout = {int(seconds * 1000)}")
    elif dialect == "mysql":
        if getattr(conn.dialect, "is_mariadb", False):
            conn.exec_driver_sql(f"SET SESSION max_statement_time = {seconds:.3f}")
        else:
            conn.exec_driver_sql(f"SET SESSION max_execution_time = {int(seconds * 1000)}")
    elif dialect == "sqlite":
        deadline = time.monotonic() + seconds
        raw = conn.connection.dbapi_connection
        raw.set_progress_handler(lambda: int(time.monotonic() > deadline), 10000)


def _read_only(conn: SAConnection, on: bool = True) -> None:
    """Make what this connection runs next read-only (or writable again).

    PostgreSQL: the transaction about to start. MariaDB/MySQL: the session, because DDL there
    commits implicitly and would escape a read-only transaction; a session that is read-only
    refuses it (1792). SQLite: `query_only`. Pooled connections are set back after the query,
    and a writing call sets its session writable first."""
    dialect = conn.dialect.name
    if dialect == "sqlite":
        conn.exec_driver_sql(f"PRAGMA query_only = {'ON' if on else 'OFF'}")
    elif dialect == "mysql":
        conn.exec_driver_sql(f"SET SESSION TRANSACTION {'READ ONLY' if on else 'READ WRITE'}")
    elif on:
        conn.exec_driver_sql("SET TRANSACTION READ ONLY")


# --- values -------------------------------------------------------------------------------

def _json_value(value):
    """A column value as JSON: exact decimals as strings, times as ISO 8601, bytes as base64."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime | date | dtime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return b64encode(bytes(value)).decode()
    return value


def _rows(result, limit: int) -> tuple[list[str], list[dict], bool]:
    if not result.returns_rows:
        return [], [], False
    columns = list(result.keys())
    fetched = result.fetchmany(limit + 1)
    rows = [{c: _json_value(v) for c, v in zip(columns, row, strict=True)}
            for row in fetched[:limit]]
    return columns, rows, len(fetched) > limit


def placeholders(clause: sa.TextClause) -> set[str]:
    """The `:name` placeholders of a statement (a `::type` cast is not one)."""
    return set(clause.compile().params)


def _statement(params: dict) -> sa.TextClause:
    """The statement with its placeholders; raises StepError("validation") when `args` does
    not give exactly the values its placeholders name."""
    import sqlalchemy as sa

    clause = sa.text(params["statement"])
    names = placeholders(clause)
    batches = params.get("args") if isinstance(params.get("args"), list) else [params.get("args") or {}]
    for index, args in enumerate(batches):
        at = f"args[{index}]" if isinstance(params.get("args"), list) else "args"
        if missing := sorted(names - set(args)):
            raise StepError("validation", f"{at} has no value for :{', :'.join(missing)}")
        if extra := sorted(set(args) - names):
            raise StepError("validation", f"{at} names {', '.join(extra)}, which the statement "
                                          "has no placeholder for")
    return clause


def _max_rows(connection: Connection, params: dict) -> int:
    cap = int(connection.get("max_rows") or DEFAULT_MAX_ROWS)
    return min(int(params.get("max_rows") or cap), cap)


# --- errors -------------------------------------------------------------------------------

_PG_CLASSES = {"57014": "timeout", "40001": "transient", "40P01": "transient",
               "55P03": "transient", "25006": "policy", "53300": "rate_limit",
               "42501": "auth", "57P01": "transient", "57P02": "transient", "57P03": "transient"}
_PG_LOGIN_REFUSED = ("password authentication failed", "does not exist", "no pg_hba.conf entry",
                     "permission denied for database", "not permitted to log in")
_MYSQL_CODES = {1045: "auth", 1044: "auth", 1698: "auth", 1142: "auth", 1143: "auth", 1227: "auth",
                1040: "rate_limit", 1203: "rate_limit", 1226: "rate_limit",
                1205: "transient", 1213: "transient", 1969: "timeout", 3024: "timeout",
                1792: "policy", 1290: "policy", 2003: "transient", 2006: "transient",
                2013: "transient", 1927: "transient", 1053: "transient"}


def classify(exc: BaseException) -> str:
    """The retry class of a database failure: timeout, transient, rate_limit, auth, policy
    (a write refused by a read-only transaction) or permanent (the statement or the data)."""
    import sqlalchemy as sa

    orig = getattr(exc, "orig", exc)
    module = type(orig).__module__
    if module.startswith("pymysql") and orig.args and isinstance(orig.args[0], int):
        code = orig.args[0]
        if code in _MYSQL_CODES:
            return _MYSQL_CODES[code]
        return "transient" if code >= 2000 else "permanent"  # 2xxx: client/connection errors
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate and module.startswith("psycopg"):
        if sqlstate in _PG_CLASSES:
            return _PG_CLASSES[sqlstate]
        if sqlstate.startswith("08"):
            return "transient"  # connection exceptions
        if sqlstate.startswith("28"):
            return "auth"
        if sqlstate.startswith("53"):
            return "transient"  # insufficient resources
        return "permanent"
    if isinstance(orig, sqlite3.Error):
        text = str(orig).lower()
        if "interrupted" in text:
            return "timeout"
        if "locked" in text or "busy" in text:
            return "transient"
        if "readonly" in text or "read-only" in text or "query_only" in text:
            return "policy"
        if "not authorized" in text or "authorization denied" in text:
            return "policy"  # refused by the connection's authorizer
        return "permanent"
    if isinstance(exc, sa.exc.TimeoutError):
        return "transient"  # the pool had no connection free in time
    if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
        return "transient"
    if isinstance(orig, OSError | ConnectionError):
        return "transient"
    if module.startswith("psycopg") and type(orig).__name__ == "OperationalError":
        # Refused at connect: psycopg gives no SQLSTATE, only the server's FATAL message.
        text = str(orig)
        if any(mark in text for mark in _PG_LOGIN_REFUSED):
            return "auth"
        if "too many connections" in text:
            return "rate_limit"
        return "transient"
    return "permanent"


def _failed(connection: Connection, exc: BaseException) -> StepError:
    error_class = classify(exc)
    orig = getattr(exc, "orig", None) or exc
    refused, _refusal.text = getattr(_refusal, "text", None), None
    if refused and isinstance(orig, sqlite3.DatabaseError) and classify(exc) == "policy":
        return failure(connection, "policy", f"{refused} is not allowed on a SQLite connection: "
                                             "a statement reaches only the connection's database")
    return failure(connection, error_class, orig)


# --- the tools ----------------------------------------------------------------------------

def check_statement(params: dict, connection) -> list[tuple[tuple, str]]:
    import sqlalchemy as sa

    problems = connection_checked(params, names=("statement",))
    if problems:
        return [(at, "statement must be literal SQL with :name placeholders; pass values in "
                     "args, never through a template") for at, _ in problems]
    statement, args = params.get("statement"), params.get("args")
    if isinstance(statement, str) and isinstance(args, dict):
        names = placeholders(sa.text(statement))
        problems += [(("args",), f"no value for :{name}") for name in sorted(names - set(args))]
        problems += [(("args", name), "the statement has no placeholder :" + name)
                     for name in sorted(set(args) - names)]
    return problems


def check_execute(params: dict, connection) -> list[tuple[tuple, str]]:
    problems = check_statement(params, connection)
    if connection is not None and not connection.get("writes"):
        problems.append((("connection",), f"connection '{connection.name}' is read-only; "
                                          "sql.execute needs one with writes: true"))
    return problems


@tool("sql.query", params_schema=QUERY_PARAMS, output_schema=QUERY_OUTPUT, connection="sql",
      check=check_statement,
      description="Run one read-only SQL query on a named connection; rows as objects.")
def sql_query(params: dict, ctx: ToolContext) -> dict:
    """Run one parameterized statement in a read-only transaction; return at most max_rows
    rows (`truncated` says whether there were more)."""
    import sqlalchemy as sa

    connection = connection_for(params, ctx, "sql")
    clause = _statement(params)
    limit = _max_rows(connection, params)
    seconds = deadline_s(connection, params, ctx)
    try:
        with engine_for(connection).connect() as conn:
            try:
                _read_only(conn)
                _limit_time(conn, seconds)
                _guard(conn)
                columns, rows, truncated = _rows(conn.execute(clause, params.get("args") or {}), limit)
            finally:
                conn.rollback()
                if conn.dialect.name == "sqlite":
                    conn.connection.dbapi_connection.set_authorizer(None)
                _read_only(conn, on=False)
                conn.rollback()
    except StepError:
        raise
    except (sa.exc.SQLAlchemyError, sqlite3.Error, OSError) as exc:
        raise _failed(connection, exc) from exc
    return {"columns": columns, "rows": rows, "row_count": len(rows), "truncated": truncated}


_tables_made: set[tuple[str, str]] = set()


def _ensure_table(engine: Engine, table: str) -> None:
    """Create the idempotency table once per process if it is missing, in autocommit mode: the
    DDL needs no transaction of its own (the operator may also create it beforehand)."""
    import sqlalchemy as sa

    if (str(engine.url), table) in _tables_made:
        return
    ddl = (f"CREATE TABLE IF NOT EXISTS {table} (effect_key VARCHAR(255) PRIMARY KEY, "
           f"result TEXT NOT NULL, created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP)")
    for attempt in range(2):
        try:
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.exec_driver_sql(ddl)
            break
        except sa.exc.IntegrityError:
            if attempt:  # PostgreSQL: two first calls raced to create it; it exists now
                raise
    _tables_made.add((str(engine.url), table))


def _stored(conn: SAConnection, table: str, key: str) -> dict | None:
    import sqlalchemy as sa

    row = conn.execute(sa.text(f"SELECT result FROM {table} WHERE effect_key = :k"),
                       {"k": key}).first()
    return json.loads(row[0]) if row and row[0] else None


@tool("sql.execute", params_schema=EXECUTE_PARAMS, output_schema=EXECUTE_OUTPUT,
      connection="sql", side_effect=True, dedupes_by_key=True, check=check_execute,
      description="Run one writing SQL statement on a named connection, exactly once.")
def sql_execute(params: dict, ctx: ToolContext) -> dict:
    """Run one parameterized statement (once per item of a list of args) in one transaction,
    together with the record of the step's idempotency key; a repeated key returns the first
    result without writing again."""
    import sqlalchemy as sa

    connection = connection_for(params, ctx, "sql")
    if not connection.get("writes"):
        raise StepError("policy", f"connection '{connection.name}' is read-only; sql.execute "
                                  "needs one with writes: true")
    clause = _statement(params)
    limit = _max_rows(connection, params)
    seconds = deadline_s(connection, params, ctx)
    table = str(connection.get("idempotency_table") or IDEMPOTENCY_TABLE)
    if not table.replace("_", "").replace(".", "").isalnum():
        raise StepError("policy", f"connection '{connection.name}': idempotency_table {table!r} "
                                  "is not a plain table name")
    key = ctx.idempotency_key
    engine = engine_for(connection)
    try:
        _ensure_table(engine, table)
        with engine.connect() as conn:
            _read_only(conn, on=False)  # a pooled session a failed reset left read-only
            _limit_time(conn, seconds)
            try:
                # The key first: a concurrent attempt with the same key waits here until this
                # transaction ends, then finds the key and returns what this one stored.
                conn.execute(sa.text(f"INSERT INTO {table} (effect_key, result) VALUES (:k, '')"),
                             {"k": key})
            except sa.exc.IntegrityError:
                conn.rollback()
                stored = _stored(conn, table, key)
                conn.rollback()
                if stored is None:
                    raise StepError("transient", "another attempt holds this effect's key") from None
                return stored
            args = params.get("args")
            _guard(conn)
            if isinstance(args, list):
                result = conn.execute(clause, args)
            else:
                result = conn.execute(clause, args or {})
            columns, rows, _ = _rows(result, limit)
            if conn.dialect.name == "sqlite":
                conn.connection.dbapi_connection.set_authorizer(None)
            output = {"row_count": max(result.rowcount, 0), "columns": columns, "rows": rows}
            conn.execute(sa.text(f"UPDATE {table} SET result = :r WHERE effect_key = :k"),
                         {"r": json.dumps(output), "k": key})
            conn.commit()
    except StepError:
        raise
    except (sa.exc.SQLAlchemyError, sqlite3.Error, OSError) as exc:
        raise _failed(connection, exc) from exc
    return output
