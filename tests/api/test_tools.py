"""`/api/v1/tools/`: every registered tool with its schemas, and the named connections the
caller's teams may use - names only."""
import pytest
from rest_framework.test import APIClient

from orchestrator.integrations.tools.registry import all_tools
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

BUILT_IN = {"http.request", "http.json", "core.echo", "sql.query", "sql.execute", "files.read",
            "files.write", "files.list", "files.delete", "rabbitmq.publish", "redis.stream_add",
            "mqtt.publish", "mail.send"}


@pytest.fixture
def defined(settings):
    settings.STEPWISE_CONNECTIONS = {
        "warehouse": {"kind": "sql", "url": "postgresql://reader@db.internal/wh",
                      "password": {"env": "WAREHOUSE_PASSWORD"}},
        "finance-db": {"kind": "sql", "url": "sqlite:///x", "teams": ["finance"]},
        "support-db": {"kind": "sql", "url": "sqlite:///y", "teams": ["support"]},
        "bus": {"kind": "rabbitmq", "url": "amqp://app@mq.internal//"},
    }


def test_every_tool_is_listed_with_its_schemas_and_retry_behaviour(api, defined):
    body = api.get("/api/v1/tools/?limit=100").json()
    tools = {t["name"]: t for t in body["results"]}
    assert len(body["results"]) == len(all_tools()) and body["next"] is None and BUILT_IN <= set(tools)
    sql = tools["sql.execute"]
    assert sql["params_schema"]["required"] == ["connection", "statement"]
    assert sql["output_schema"]["required"] == ["row_count", "columns", "rows"]
    assert (sql["side_effect"], sql["exactly_once"], sql["connection_kind"]) == (True, "remote_key", "sql")
    assert tools["sql.query"]["side_effect"] is False
    assert tools["email.send"]["exactly_once"] == "lookup"  # the example tool reconciles by lookup
    assert tools["core.echo"]["connections"] is None


def test_connections_are_listed_by_name_for_the_callers_teams_only(api, requester, defined, outsider):
    tools = {t["name"]: t for t in api.get("/api/v1/tools/?limit=100").json()["results"]}
    assert tools["sql.query"]["connections"] == ["support-db", "warehouse"]
    assert tools["rabbitmq.publish"]["connections"] == ["bus"]
    assert "db.internal" not in str(tools) and "WAREHOUSE_PASSWORD" not in str(tools)
    other = client_for(outsider).get("/api/v1/tools/sql.query/").json()
    assert other["connections"] == ["warehouse"]
    refused = api.get("/api/v1/tools/?team=finance")
    assert refused.status_code == 403
    assert refused.json()["errors"][0]["path"] == "team"
    assert api.get("/api/v1/tools/sql.query/?team=support").json()["connections"] == [
        "support-db", "warehouse"]
    assert api.get("/api/v1/tools/?offset=null").status_code == 400  # checked like every list


def test_an_unknown_tool_is_404_and_an_anonymous_caller_sees_nothing(api, defined):
    missing = api.get("/api/v1/tools/sql.drop/")
    assert missing.status_code == 404 and missing.json()["errors"][0]["path"] == "name"
    assert APIClient().get("/api/v1/tools/").status_code in (401, 403)
