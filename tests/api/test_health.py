import pytest
from django.utils import timezone

from orchestrator.models import WorkerHeartbeat


@pytest.mark.django_db
def test_health_reports_database_broker_and_recent_workers_without_auth(client):
    WorkerHeartbeat.objects.create(hostname="w1", queues=["tools"], last_seen=timezone.now())
    WorkerHeartbeat.objects.create(
        hostname="stale", queues=["tools"], last_seen=timezone.now() - timezone.timedelta(minutes=5)
    )

    response = client.get("/api/v1/health/")

    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"status", "database", "broker", "workers"}
    assert body["database"] == "ok"
    assert body["status"] in ("ok", "degraded")
    assert body["status"] == ("ok" if body["broker"] == "ok" else "degraded")
    # (integration tests' real workers may be beating into this database too)
    seen = {w["hostname"]: w for w in body["workers"]}
    assert "w1" in seen and "stale" not in seen
    assert seen["w1"]["queues"] == ["tools"]


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
