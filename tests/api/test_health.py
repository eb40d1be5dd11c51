"""Health: liveness for anyone says "ok" and nothing else; the details (database, broker,
workers' host names and queues) are for operators only — staff alone is not enough."""
import pytest
from django.utils import timezone

from orchestrator.models import Role, WorkerHeartbeat

from ..conftest import client_for
from ..factories import UserFactory, member


@pytest.fixture
def beating_workers(db):
    WorkerHeartbeat.objects.create(hostname="w1.internal", queues=["tools"], last_seen=timezone.now())
    WorkerHeartbeat.objects.create(hostname="stale.internal", queues=["tools"],
                                   last_seen=timezone.now() - timezone.timedelta(minutes=5))


@pytest.fixture
def operations(team):
    """An operator of a team (redrive, retry, skip, resume), without being staff."""
    return member(team, "operations", role=Role.OPERATOR)


@pytest.fixture
def staffer(db):
    """Staff, with no role in any team."""
    return UserFactory(username="staffer", is_staff=True)


def test_liveness_tells_an_anonymous_caller_ok_and_nothing_else(client, beating_workers):
    response = client.get("/api/v1/health/")

    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert b"w1.internal" not in response.content and b"tools" not in response.content


def test_health_details_are_refused_to_anonymous_callers(client, beating_workers):
    response = client.get("/api/v1/health/details/")

    assert response.status_code == 401
    assert b"w1.internal" not in response.content


@pytest.mark.parametrize("persona", ["requester", "staffer"])
def test_health_details_are_refused_to_members_and_to_staff_without_the_operator_role(
        request, persona, beating_workers):
    user = request.getfixturevalue(persona)

    response = client_for(user).get("/api/v1/health/details/")

    assert response.status_code == 403
    assert response.json() == {"errors": [{"path": "", "message": (
        "health details are for operators: the operator or owner role in a team "
        "(docs/permissions.md)")}]}


@pytest.mark.parametrize("persona", ["operations", "superuser"])
def test_health_details_show_database_broker_and_recent_workers_to_operators(
        request, persona, admin_user, beating_workers):
    user = admin_user if persona == "superuser" else request.getfixturevalue(persona)

    response = client_for(user).get("/api/v1/health/details/")

    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"status", "database", "broker", "workers"}
    assert body["database"] == "ok"
    assert body["status"] == ("ok" if body["broker"] == "ok" else "degraded")
    # (integration tests' real workers may be beating into this database too)
    seen = {w["hostname"]: w for w in body["workers"]}
    assert "w1.internal" in seen and "stale.internal" not in seen
    assert seen["w1.internal"]["queues"] == ["tools"]


@pytest.mark.django_db
def test_definition_schema_is_served_without_auth(client):
    response = client.get("/api/v1/schema/definition.json")

    assert response.status_code == 200
    assert "steps" in response.json()["properties"]


@pytest.mark.django_db
def test_openapi_document_and_docs_are_served(api):
    assert api.get("/api/v1/schema/").status_code == 200
    assert api.get("/api/v1/docs/").status_code == 200


@pytest.mark.django_db
def test_api_requires_authentication(client):
    assert client.get("/api/v1/workflows/").status_code in (401, 403)
