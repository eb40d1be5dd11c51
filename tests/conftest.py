"""Shared fixtures: personas (requester, approver, operator, outsider) and API clients."""
import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from orchestrator.models import Role

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


@pytest.fixture(autouse=True)
def audit_checkpoint_dir(tmp_path, settings):
    """Each test's signed ledger checkpoints in a directory of its own.

    A test's ledger entries are rolled back after it; a checkpoint of them left where the next
    test looks would make that test's `audit_verify` report a truncated tail.
    """
    settings.AUDIT_CHECKPOINT_DIR = tmp_path / "audit-checkpoints"
    return settings.AUDIT_CHECKPOINT_DIR


@pytest.fixture
def team(db):
    return TeamFactory(slug="support", name="Support")


@pytest.fixture
def requester(team):
    """An editor of the support team: starts runs and edits workflows."""
    return member(team, "requester", role=Role.EDITOR)


@pytest.fixture
def approver(team):
    """A support lead: a member of the support team who may approve its gate."""
    return member(team, "approver", role=Role.MEMBER, groups=("support_leads",))


@pytest.fixture
def operator(team):
    """An operator of the support team: cancels, resumes, retries, skips and redrives."""
    return member(team, "operator", role=Role.OPERATOR, staff=True)


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
