"""Shared fixtures: personas (requester, approver, operator, outsider) and API clients."""
import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from .factories import TeamFactory, member
from .support.egress import LOCAL_SERVERS


@pytest.fixture(scope="session", autouse=True)
def egress_allows_local_servers():
    """Tests call local servers on 127.0.0.1: allow loopback explicitly for the whole session
    (a test that needs another policy sets `settings.STEPWISE_EGRESS` itself)."""
    from django.conf import settings

    before = getattr(settings, "STEPWISE_EGRESS", {})
    settings.STEPWISE_EGRESS = LOCAL_SERVERS
    yield
    settings.STEPWISE_EGRESS = before


@pytest.fixture
def team(db):
    return TeamFactory(slug="support", name="Support")


@pytest.fixture
def requester(team):
    """Starts runs and edits workflows of the support team."""
    return member(team, "requester")


@pytest.fixture
def approver(team):
    """A support lead: may approve the support workflow's gate."""
    return member(team, "approver", groups=("support_leads",))


@pytest.fixture
def operator(team):
    """Staff: sees and operates everything."""
    return member(team, "operator", staff=True)


@pytest.fixture
def outsider(db):
    """A user of another team: must see nothing of the support team."""
    other = TeamFactory(slug="other", name="Other")
    return member(other, "outsider")


def client_for(user) -> APIClient:
    client = APIClient()
    token, _ = Token.objects.get_or_create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


@pytest.fixture
def api(requester):
    return client_for(requester)


@pytest.fixture
def approver_api(approver):
    return client_for(approver)


@pytest.fixture
def outsider_api(outsider):
    return client_for(outsider)


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    """Remove a stale SQLite WAL/SHM pair before the test database is created.

    Django deletes an old test database file but not its -wal/-shm companions; a new database
    beside a stale pair fails with "disk I/O error" in the worker processes.
    """
    from pathlib import Path

    from django.conf import settings

    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3") and db.get("TEST", {}).get("NAME"):
        for suffix in ("-wal", "-shm", ""):
            Path(f"{db['TEST']['NAME']}{suffix}").unlink(missing_ok=True)
