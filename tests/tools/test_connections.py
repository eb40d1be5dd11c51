"""Named connections: the setting's rules, credentials from outside it, team grants, and the
refusals made when a definition is saved."""
import pytest

from orchestrator.engine.definitions import DefinitionInvalid
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.integrations.connections import ConnectionRefused, config_problems, connection_get
from tests.factories import SETUP

from .conftest import call, fails

SQLITE = {"kind": "sql", "url": "sqlite:////nonexistent/x.sqlite3"}


@pytest.mark.parametrize("entry, problem", [
    ({"kind": "sql", "url": "postgresql://app:hunter2@db/app"}, "url carries a password"),
    ({"kind": "sql", "url": "postgresql://app@db/app", "password": "hunter2"},
     "password must come from the environment or a secrets file"),
    ({"kind": "http", "base_url": "https://api.example.com",
      "auth": {"type": "bearer", "token": "abc123"}}, "auth token must come from the environment"),
    ({"kind": "ftp"}, "kind must be one of"),
    ({"kind": "sql", "url": "oracle://db/x"}, "url must be a sqlite://"),
    ({"kind": "files", "root": "/srv", "writes": "yes"}, "writes must be true or false"),
    ({"kind": "mail", "backend": "smtp"}, "from_email is required"),
    ({"kind": "sql", "url": "sqlite:///x", "hostname": "db"}, "unknown field 'hostname'"),
])
def test_a_malformed_connection_or_a_written_credential_is_a_configuration_error(
        settings, entry, problem):
    settings.STEPWISE_CONNECTIONS = {"warehouse": entry}
    problems = config_problems()
    assert any(problem in p for p in problems), problems
    with pytest.raises(ConnectionRefused, match="misconfigured"):
        connection_get("warehouse", kind=entry["kind"], team="support")


def test_credentials_come_from_the_environment_or_a_secrets_file(settings, monkeypatch, tmp_path):
    secret_file = tmp_path / "pw"
    secret_file.write_text("from-a-file\n")
    monkeypatch.setenv("INTEGRATIONS_TEST_PW", "from-the-env")
    settings.STEPWISE_CONNECTIONS = {
        "a": {"kind": "sql", "url": "postgresql://app@db/app", "password": {"env": "INTEGRATIONS_TEST_PW"}},
        "b": {"kind": "sql", "url": "postgresql://app@db/app", "password": {"file": str(secret_file)}},
        "c": {"kind": "sql", "url": "postgresql://app@db/app", "password": {"env": "INTEGRATIONS_UNSET"}},
    }
    assert config_problems() == []
    assert connection_get("a", kind="sql", team="t").secret("password") == "from-the-env"
    assert connection_get("b", kind="sql", team="t").secret("password") == "from-a-file"
    with pytest.raises(ConnectionRefused, match="INTEGRATIONS_UNSET is not set"):
        connection_get("c", kind="sql", team="t").secret("password")
    # A message that happens to carry the credential never shows it.
    conn = connection_get("a", kind="sql", team="t")
    assert conn.scrub("login failed for from-the-env") == "login failed for [redacted]"
    assert "from-the-env" not in repr(conn)


def test_a_connection_is_used_only_by_the_teams_it_is_granted_to_and_for_its_kind(connections):
    connections(warehouse={**SQLITE, "teams": ["finance"]})
    assert connection_get("warehouse", kind="sql", team="finance").name == "warehouse"
    with pytest.raises(ConnectionRefused, match="not granted to team 'support'"):
        connection_get("warehouse", kind="sql", team="support")
    with pytest.raises(ConnectionRefused, match="is a sql connection, not files"):
        connection_get("warehouse", kind="files", team="finance")
    with pytest.raises(ConnectionRefused, match="no connection named 'nope'"):
        connection_get("nope", kind="sql", team="finance")
    # At run time the same refusals are `policy` failures: never retried.
    fails("policy", "sql.query", {"connection": "warehouse", "statement": "SELECT 1"})
    fails("policy", "sql.query", {"connection": "nope", "statement": "SELECT 1"})


def tool_step(tool, params, **extra):
    return {"name": "step", "type": "tool", "tool": tool, "params": params, **extra}


def save(team, *steps):
    return workflow_save(team=team, definition={
        "name": "uses-connections", "input_schema": {"type": "object"}, "steps": list(steps)},
        actor=SETUP)


def problems_of(team, *steps) -> dict[str, str]:
    with pytest.raises(DefinitionInvalid) as caught:
        save(team, *steps)
    return {p.path: p.message for p in caught.value.problems}


@pytest.mark.django_db
@pytest.mark.parametrize("step, path, message", [
    (tool_step("sql.query", {"connection": "missing", "statement": "SELECT 1"}),
     "steps[0].params.connection", "no connection named 'missing' is configured"),
    (tool_step("sql.query", {"connection": "{{ input.db }}", "statement": "SELECT 1"}),
     "steps[0].params.connection", "must name a connection literally"),
    (tool_step("sql.query", {"connection": "finance-db", "statement": "SELECT 1"}),
     "steps[0].params.connection", "not granted to team 'support'"),
    (tool_step("files.read", {"connection": "warehouse", "path": "a.txt"}),
     "steps[0].params.connection", "is a sql connection, not files"),
    (tool_step("sql.execute", {"connection": "warehouse", "statement": "DELETE FROM t"}),
     "steps[0].params.connection", "connection 'warehouse' is read-only"),
    (tool_step("sql.query", {"connection": "warehouse",
                             "statement": "SELECT * FROM t WHERE id = {{ input.id }}"}),
     "steps[0].params.statement", "statement must be literal SQL with :name placeholders"),
    (tool_step("sql.query", {"connection": "warehouse", "statement": "SELECT :a, :b",
                             "args": {"a": 1, "c": 2}}),
     "steps[0].params.args", "no value for :b"),
    (tool_step("files.write", {"connection": "drop", "path": "a.txt", "content": "x"}),
     "steps[0].params.connection", "connection 'drop' is read-only"),
    (tool_step("files.read", {"connection": "drop", "path": "../etc/passwd"}),
     "steps[0].params.path", "does not match"),
    (tool_step("mail.send", {"connection": "relay", "to": ["eve@evil.test"], "subject": "s",
                             "body": "b"}),
     "steps[0].params.to[0]", "'eve@evil.test' is outside the allowed domains"),
    (tool_step("mail.send", {"connection": "relay", "to": ["ann@example.com"], "subject": "s",
                             "body": "b", "allowed_domains": "{{ input.domains }}"}),
     "steps[0].params.allowed_domains", "must be literal"),
    (tool_step("rabbitmq.publish", {"connection": "bus", "exchange": "payments",
                                    "message": {}}),
     "steps[0].params.exchange", "allows publishing only to 'events'"),
    (tool_step("mqtt.publish", {"connection": "mqtt", "topic": "factory/door", "message": 1}),
     "steps[0].params.topic", "allows publishing only to integrations/#"),
    (tool_step("http.json", {"connection": "crm", "path": "/x",
                             "headers": {"Authorization": "Bearer stolen"}}),
     "steps[0].params.headers.Authorization", "set by the connection, never by a step"),
])
def test_saving_refuses_what_the_named_connection_does_not_allow_with_a_path(
        connections, team, step, path, message):
    connections(
        warehouse=SQLITE, **{"finance-db": {**SQLITE, "teams": ["finance"]}},
        drop={"kind": "files", "root": "/tmp/none"},
        relay={"kind": "mail", "backend": "file", "path": "/tmp/none", "from_email": "a@example.com",
               "allowed_domains": ["example.com"]},
        bus={"kind": "rabbitmq", "url": "amqp://guest@127.0.0.1//", "exchanges": ["events"]},
        mqtt={"kind": "mqtt", "host": "127.0.0.1", "topics": ["integrations/#"]},
        crm={"kind": "http", "base_url": "https://crm.example.com/api"},
    )
    problems = problems_of(team, step)
    assert path in problems, problems
    assert message in problems[path]


@pytest.mark.django_db
def test_a_definition_within_what_its_connections_allow_saves(connections, team):
    connections(warehouse={**SQLITE, "writes": True, "teams": ["support"]},
                relay={"kind": "mail", "backend": "file", "path": "/tmp/none",
                       "from_email": "a@example.com"})
    version, created = save(
        team,
        tool_step("sql.execute", {"connection": "warehouse",
                                  "statement": "INSERT INTO t (a) VALUES (:a)",
                                  "args": {"a": "{{ input.a }}"}}),
        {**tool_step("mail.send", {"connection": "relay", "to": ["{{ input.email }}"],
                                   "subject": "Hello {{ input.a }}", "body": "b",
                                   "allowed_domains": ["example.com"]}), "name": "mail"})
    assert created


def test_a_statement_takes_values_only_as_bound_args(connections, tmp_path):
    db = tmp_path / "x.sqlite3"
    connections(local={"kind": "sql", "url": f"sqlite:///{db}", "writes": True})
    call("sql.execute", {"connection": "local", "statement": "CREATE TABLE t (a TEXT)"})
    hostile = "x'); DROP TABLE t; --"
    call("sql.execute", {"connection": "local", "statement": "INSERT INTO t (a) VALUES (:a)",
                         "args": {"a": hostile}})
    rows = call("sql.query", {"connection": "local", "statement": "SELECT a FROM t"})["rows"]
    assert rows == [{"a": hostile}]
    fails("validation", "sql.query", {"connection": "local", "statement": "SELECT :a, :b",
                                      "args": {"a": 1}})
