"""`sql.query` and `sql.execute` against SQLite, and the real PostgreSQL and MariaDB servers:
rows, limits, read-only refusals, exactly-once writes, and every error class."""
import secrets
import threading

import psycopg
import pymysql
import pytest

from tests.support.integrations import MARIADB_URL, PG_URL, closed_port, need

from .conftest import call, fails

BACKENDS = ["sqlite", "postgresql", "mariadb"]


@pytest.fixture(params=BACKENDS)
def db(request, connections, tmp_path):
    """(backend, a table name of the test's own) with a read-only connection `reader` and a
    writing one `writer` to the same database; the table and the key table are dropped after."""
    backend = request.param
    table = f"integrations_{secrets.token_hex(4)}"
    keys = f"integrations_effects_{secrets.token_hex(3)}"
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'db.sqlite3'}"
    else:
        need({"postgresql": "PostgreSQL", "mariadb": "MariaDB"}[backend])
        url = PG_URL if backend == "postgresql" else MARIADB_URL
    connections(reader={"kind": "sql", "url": url},
                writer={"kind": "sql", "url": url, "writes": True, "idempotency_table": keys,
                        "max_rows": 3})
    call("sql.execute", {"connection": "writer", "statement":
                         f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, name VARCHAR(50), "
                         "amount DECIMAL(10,2))"})
    yield backend, table
    for name in (table, keys):
        drop = f"DROP TABLE IF EXISTS {name}"
        if backend == "postgresql":
            with psycopg.connect(PG_URL, autocommit=True) as conn:
                conn.execute(drop)
        elif backend == "mariadb":
            conn = pymysql.connect(host="127.0.0.1", user="root", database="test", autocommit=True)
            with conn.cursor() as cursor:
                cursor.execute(drop)
            conn.close()


def insert(table, rows, key=None):
    return call("sql.execute", {
        "connection": "writer", "statement":
            f"INSERT INTO {table} (id, name, amount) VALUES (:id, :name, :amount)",
        "args": rows}, key=key)


def test_query_returns_rows_as_objects_and_stops_at_the_row_limit(db):
    backend, table = db
    insert(table, [{"id": i, "name": f"n{i}", "amount": f"{i}.50"} for i in range(1, 6)])
    out = call("sql.query", {"connection": "reader", "statement":
                             f"SELECT id, name, amount FROM {table} WHERE id >= :low ORDER BY id",
                             "args": {"low": 2}, "max_rows": 2})
    assert out["columns"] == ["id", "name", "amount"]
    assert [r["id"] for r in out["rows"]] == [2, 3] and out["truncated"] is True
    assert str(out["rows"][0]["amount"]) in ("2.50", "2.5")  # exact decimals stay exact
    # The connection's max_rows (3) caps whatever the step asks for.
    capped = call("sql.query", {"connection": "writer", "statement": f"SELECT id FROM {table}",
                                "max_rows": 100})
    assert capped["row_count"] == 3 and capped["truncated"] is True


@pytest.mark.parametrize("statement", ["INSERT INTO {t} (id) VALUES (99)", "DELETE FROM {t}",
                                       "CREATE TABLE {t}_x (a INTEGER)", "DROP TABLE {t}"])
def test_query_never_writes_even_on_a_connection_that_allows_writes(db, statement):
    backend, table = db
    insert(table, [{"id": 1, "name": "a", "amount": "1"}])
    error = fails("policy", "sql.query", {"connection": "writer",
                                          "statement": statement.format(t=table)})
    assert "read" in error.message.lower()
    assert call("sql.query", {"connection": "reader",
                              "statement": f"SELECT count(*) AS n FROM {table}"})["rows"] == [{"n": 1}]


def test_execute_is_refused_on_a_read_only_connection(db):
    backend, table = db
    error = fails("policy", "sql.execute", {"connection": "reader",
                                            "statement": f"DELETE FROM {table}"})
    assert "read-only" in error.message


def test_execute_writes_once_per_idempotency_key(db):
    backend, table = db
    first = insert(table, [{"id": 1, "name": "a", "amount": "1"}], key="run-1:save:default")
    again = insert(table, [{"id": 1, "name": "a", "amount": "1"}], key="run-1:save:default")
    assert first == again == {"row_count": 1, "columns": [], "rows": []}
    insert(table, [{"id": 2, "name": "b", "amount": "2"}], key="run-2:save:default")
    count = call("sql.query", {"connection": "reader", "statement": f"SELECT count(*) AS n FROM {table}"})
    assert count["rows"] == [{"n": 2}]


def test_concurrent_attempts_with_one_key_write_once(db):
    backend, table = db
    results, errors = [], []

    def attempt():
        try:
            results.append(insert(table, [{"id": 7, "name": "x", "amount": "1"}], key="run-3:s:default"))
        except Exception as exc:  # a lost race must not be a duplicate-key failure
            errors.append(exc)

    threads = [threading.Thread(target=attempt) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors or all(e.error_class == "transient" for e in errors), errors
    count = call("sql.query", {"connection": "reader", "statement": f"SELECT count(*) AS n FROM {table}"})
    assert count["rows"] == [{"n": 1}]


SLOW = {"sqlite": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
                  "SELECT count(*) FROM c",
        "postgresql": "SELECT pg_sleep(5)", "mariadb": "SELECT SLEEP(5)"}


def test_a_statement_past_its_time_limit_is_a_timeout(db):
    backend, _ = db
    fails("timeout", "sql.query", {"connection": "reader", "statement": SLOW[backend],
                                   "timeout_s": 0.5})


def test_a_bad_statement_is_permanent(db):
    backend, table = db
    fails("permanent", "sql.query", {"connection": "reader", "statement": "SELEC oops"})
    fails("permanent", "sql.query", {"connection": "reader", "statement": "SELECT * FROM integrations_none"})
    insert(table, [{"id": 1, "name": "a", "amount": "1"}])
    fails("permanent", "sql.execute", {"connection": "writer", "statement":
                                       f"INSERT INTO {table} (id) VALUES (1)"})


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])
def test_a_server_that_does_not_answer_is_transient(connections, backend):
    scheme = "postgresql" if backend == "postgresql" else "mysql"
    connections(down={"kind": "sql", "url": f"{scheme}://root@127.0.0.1:{closed_port()}/x"})
    fails("transient", "sql.query", {"connection": "down", "statement": "SELECT 1"})


def test_a_locked_sqlite_database_is_transient(connections, tmp_path):
    path = tmp_path / "locked.sqlite3"
    connections(db={"kind": "sql", "url": f"sqlite:///{path}", "writes": True, "timeout_s": 0.5})
    call("sql.execute", {"connection": "db", "statement": "CREATE TABLE t (a INTEGER)"})
    import sqlite3  # noqa: PLC0415 - a raw second writer, only here

    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        fails("transient", "sql.execute", {"connection": "db", "statement": "INSERT INTO t VALUES (1)"})
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_postgresql_login_refusal_is_auth_and_a_full_role_is_rate_limit(connections):
    need("PostgreSQL")
    role = f"integrations_{secrets.token_hex(3)}"
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 0")
    try:
        connections(stranger={"kind": "sql", "url": "postgresql://integrations_nobody@127.0.0.1:5432/stepwise_integrations"},
                    full={"kind": "sql", "url": f"postgresql://{role}@127.0.0.1:5432/stepwise_integrations"})
        fails("auth", "sql.query", {"connection": "stranger", "statement": "SELECT 1"})
        fails("rate_limit", "sql.query", {"connection": "full", "statement": "SELECT 1"})
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f"DROP ROLE {role}")


def test_mariadb_login_refusal_is_auth_and_a_user_over_its_connections_is_rate_limit(connections):
    need("MariaDB")
    user = f"integrations_{secrets.token_hex(3)}"
    admin = pymysql.connect(host="127.0.0.1", user="root", database="test", autocommit=True)
    with admin.cursor() as cursor:
        cursor.execute(f"CREATE USER '{user}'@'%' WITH MAX_USER_CONNECTIONS 1")
        cursor.execute(f"CREATE USER '{user}'@'localhost' WITH MAX_USER_CONNECTIONS 1")
        cursor.execute(f"GRANT SELECT ON test.* TO '{user}'@'%'")
        cursor.execute(f"GRANT SELECT ON test.* TO '{user}'@'localhost'")
    held = pymysql.connect(host="127.0.0.1", user=user, database="test")
    try:
        connections(stranger={"kind": "sql", "url": "mysql://integrations_nobody@127.0.0.1:3306/test"},
                    busy={"kind": "sql", "url": f"mysql://{user}@127.0.0.1:3306/test"})
        fails("auth", "sql.query", {"connection": "stranger", "statement": "SELECT 1"})
        fails("rate_limit", "sql.query", {"connection": "busy", "statement": "SELECT 1"})
    finally:
        held.close()
        with admin.cursor() as cursor:
            cursor.execute(f"DROP USER IF EXISTS '{user}'@'%'")
            cursor.execute(f"DROP USER IF EXISTS '{user}'@'localhost'")
        admin.close()


@pytest.mark.parametrize(("tool", "statement", "named"), [
    ("sql.query", "ATTACH DATABASE '{path}' AS other", "ATTACH"),
    ("sql.execute", "ATTACH DATABASE '{path}' AS other", "ATTACH"),
    ("sql.query", "VACUUM INTO '{path}'", "ATTACH"),
    ("sql.query", "DETACH DATABASE main", "DETACH"),
    ("sql.query", "SELECT load_extension('{path}')", "load_extension"),
    ("sql.execute", "PRAGMA writable_schema = ON", "PRAGMA writable_schema"),
    ("sql.query", "PRAGMA temp_store_directory = '{path}'", "PRAGMA temp_store_directory"),
])
def test_sqlite_refuses_what_reaches_past_its_own_file(connections, tmp_path, tool, statement,
                                                       named):
    """ATTACH creates any file the worker may write; VACUUM INTO writes one; load_extension
    runs code: the connection's authorizer refuses them before they run."""
    connections(local={"kind": "sql", "url": f"sqlite:///{tmp_path / 'db.sqlite3'}",
                       "writes": True})
    target = tmp_path / "elsewhere.sqlite3"
    error = fails("policy", tool, {"connection": "local",
                                   "statement": statement.format(path=target)})
    assert named in error.message and "not allowed" in error.message
    assert not target.exists()
    # The same connection still answers what stays inside its file, pragmas that read included.
    assert call("sql.query", {"connection": "local", "statement": "SELECT 1 AS one"})["rows"] == [
        {"one": 1}]
    assert call("sql.query", {"connection": "local",
                              "statement": "PRAGMA table_list"})["columns"]
