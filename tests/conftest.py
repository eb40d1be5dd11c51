"""Shared fixtures: personas (requester, approver, operator, outsider) and API clients."""
import os
from collections import Counter

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from orchestrator.models import Role

from .factories import TeamFactory, member
from .support.egress import LOCAL_SERVERS


@pytest.hookimpl(trylast=True)  # after `-m` has deselected what does not run
def pytest_collection_modifyitems(items):
    """The `ledger_prefix` tests first: they need a ledger no other test wrote to. Under xdist
    (`make test`: `--dist loadfile --no-loadscope-reorder` hands out files in this order) the
    soak comes next, then the files whose tests start worker processes (those without the web
    server first, then those with it), then those that start only a browser (and a web server),
    then the rest, each group with the files of most tests first: a long file handed out last
    would run alone at the end while the other processes wait. A process so takes its files
    needing each session process (`session_processes_only_where_asked`) one after the other and
    starts and stops each about once, not for every file between two that need it.
    Tests of the fast store's own statements (`fast_store`) run with that store only."""
    from django.conf import settings

    per_file = Counter(item.path for item in items)
    # Files whose tests run real worker processes or a browser: they take most of the time.
    with_workers = {item.path for item in items if "workers" in item.fixturenames}
    with_server = {item.path for item in items
                   if {"web_server", "browser_page", "browser"} & set(item.fixturenames)}

    def rank(item) -> tuple[int, int]:
        if item.get_closest_marker("ledger_prefix"):
            return 0, 0
        if not os.environ.get("PYTEST_XDIST_WORKER"):
            return 6, 0
        if item.get_closest_marker("soak"):
            return 1, 0
        group = {(True, False): 2, (True, True): 3, (False, True): 4, (False, False): 5}[
            item.path in with_workers, item.path in with_server]
        return group, -per_file[item.path]

    items.sort(key=rank)  # stable: each file's tests keep their order
    if settings.STEPWISE_STORE != "fast":
        skip = pytest.mark.skip(reason="about the fast store's own statements (STEPWISE_STORE=fast)")
        for item in items:
            if "fast_store" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def egress_allows_local_servers():
    """Tests call local servers on 127.0.0.1: allow loopback explicitly for the whole session
    (a test that needs another policy sets `settings.STEPWISE_EGRESS` itself)."""
    from django.conf import settings

    before = getattr(settings, "STEPWISE_EGRESS", {})
    settings.STEPWISE_EGRESS = LOCAL_SERVERS
    yield
    settings.STEPWISE_EGRESS = before


@pytest.fixture(scope="session", autouse=True)
def quick_password_hashing():
    """Test users' passwords hashed at one iteration (tests/support/hashers.py): the default
    hasher spends about half a second of CPU on each user created or signed in with one."""
    from django.conf import settings
    from django.test import override_settings

    with override_settings(PASSWORD_HASHERS=["tests.support.hashers.QuickPBKDF2PasswordHasher",
                                             *settings.PASSWORD_HASHERS]):
        yield


@pytest.fixture(scope="session", autouse=True)
def redis_left_empty_by_earlier_sessions():
    """Under pytest-xdist each test worker has a Redis database of its own (the settings'
    `_isolated_redis`); an earlier session may have left messages in it — a killed worker's
    unacknowledged ones come back to the queue an hour later — naming steps by ids that a new
    test database gives out again. Emptied before this session sends or consumes anything.
    Not without xdist: the URL given is then used as it is, and may be someone's own."""
    from django.conf import settings

    if settings.XDIST_INDEX < 0:
        return
    import redis

    for url in {settings.CELERY_BROKER_URL, settings.REDIS_URL}:
        if url.startswith("redis"):
            redis.Redis.from_url(url).flushdb()


@pytest.fixture(scope="session", autouse=True)
def test_process_loses_no_deadlock_to_a_worker():
    """On PostgreSQL, the test process's own connections wait 20 s before looking for a
    deadlock (PostgreSQL's default: 1 s), so when a flush between transactional tests meets a
    real worker's transaction (the session's worker group, still finishing an earlier test's
    run), the worker's transaction is the one PostgreSQL cancels: the flush's TRUNCATE takes
    the tables one by one and once lost to a worker reading two of them in the other order.
    A worker's transaction cancelled is an ordinary failed attempt; a failed flush failed the
    next test. Only a superuser may set it; elsewhere PostgreSQL's default stays."""
    from django.db.backends.signals import connection_created

    def slower_deadlock_check(sender, connection, **kwargs):
        if connection.vendor != "postgresql":
            return
        with connection.cursor() as cursor:
            cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            if cursor.fetchone()[0]:
                cursor.execute("SET deadlock_timeout = '20s'")

    connection_created.connect(slower_deadlock_check, weak=False)
    yield
    connection_created.disconnect(slower_deadlock_check)


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
    if db["ENGINE"].endswith("sqlite3") and "MUTANT_UNDER_TEST" in os.environ:
        yield from _mutation_database(db)
        return
    if db["ENGINE"].endswith("sqlite3") and db.get("TEST", {}).get("NAME"):
        for suffix in ("-wal", "-shm", ""):
            Path(f"{db['TEST']['NAME']}{suffix}").unlink(missing_ok=True)
        if _from_template(db):
            _copy(_migrated_template(), Path(db["TEST"]["NAME"]))
    yield


def _from_template(db: dict) -> bool:
    return (db["ENGINE"].endswith("sqlite3") and bool(db.get("TEST", {}).get("NAME"))
            and "MUTANT_UNDER_TEST" not in os.environ)


@pytest.fixture(scope="session")
def django_db_keepdb(request):
    """On SQLite the test database is a copy of a migrated template (`_migrated_template`):
    Django keeps it, and its migrate finds nothing left to apply."""
    from django.conf import settings

    return request.config.getvalue("reuse_db") or _from_template(settings.DATABASES["default"])


def _migrated_template():
    """var/test-template-<digest>.sqlite3: every migration applied once, for every session.
    Migrating takes a process seconds of CPU, and `make test` starts four sessions at once; the
    first to come builds the template under a lock and the others wait, then each copies it.
    The digest covers every installed app's migrations, so a new or changed one builds anew."""
    import fcntl
    import hashlib
    import subprocess
    import sys
    from pathlib import Path

    from django.apps import apps
    from django.conf import settings

    digest = hashlib.sha256()
    for config in sorted(apps.get_app_configs(), key=lambda c: c.label):
        for path in sorted(Path(config.path, "migrations").glob("*.py")):
            digest.update(f"{config.label}/{path.name}".encode() + path.read_bytes())
    var = Path(settings.VAR_DIR)
    template = var / f"test-template-{digest.hexdigest()[:16]}.sqlite3"
    var.mkdir(parents=True, exist_ok=True)
    with (var / "test-template.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not template.exists():
            for stale in var.glob("test-template-*.sqlite3*"):
                stale.unlink()
            building = template.with_suffix(".building")
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("PYTEST_", "DATABASE_URL"))}
            subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v0"],
                           cwd=Path(__file__).resolve().parents[1], check=True,
                           env={**env, "STEPWISE_SQLITE_PATH": str(building)})
            _copy(building, template)
            for suffix in ("-wal", "-shm", ""):
                Path(f"{building}{suffix}").unlink(missing_ok=True)
    return template


def _copy(source, target) -> None:
    """A consistent copy, through SQLite's backup API (a WAL database is more than its file)."""
    import sqlite3

    with sqlite3.connect(source) as reading, sqlite3.connect(target) as writing:
        reading.backup(writing)

def _mutation_database(db: dict):
    """Under mutmut: one migrated template database, and a private copy of it per mutant.
    mutmut forks a process per mutant, two at a time; each starts a pytest session of its own,
    which would migrate a new test database (seconds, for tests that take milliseconds) and,
    sharing one file, delete the other's. The template is made by mutmut's first, clean run
    (`--reuse-db` keeps it); a mutant's process takes a consistent copy through SQLite's backup
    API and removes it when its session ends.
    """
    import sqlite3
    from pathlib import Path

    from django.conf import settings

    template = Path(settings.VAR_DIR) / "test_mutmut.sqlite3"
    mutant = os.environ["MUTANT_UNDER_TEST"]
    if mutant in ("", "stats", "mutant_generation", "fail") or not template.exists():
        db["TEST"]["NAME"] = str(template)
        yield
        return
    private = Path(settings.VAR_DIR) / f"test_mutmut_{os.getpid()}.sqlite3"
    with sqlite3.connect(template) as source, sqlite3.connect(private) as target:
        source.backup(target)
    db["TEST"]["NAME"] = str(private)
    yield
    for suffix in ("-wal", "-shm", ""):
        Path(f"{private}{suffix}").unlink(missing_ok=True)


@pytest.fixture
def move_clock(monkeypatch):
    """The engine's clock (`orchestrator.engine.clock`), frozen at the test's start; `move_clock(s)`
    sets it `s` seconds after that start. A test waits on this clock, never on the wall."""
    from datetime import timedelta

    from orchestrator.engine import clock

    start = clock.now()
    monkeypatch.setattr(clock, "_source", lambda: start)

    def move(seconds: float) -> None:
        monkeypatch.setattr(clock, "_source", lambda: start + timedelta(seconds=seconds))

    return move


# The session's processes a test may ask for by fixture name (the worker group, the web
# server), once a test has asked: only tests that ask for one (directly or through their
# fixtures) have it running. Under `make test` a process runs the integration and browser files
# first and everything else after, and a step a unit test drives itself must not be taken by a
# worker left running by an earlier file, nor a page's nudges sent by a server's relay.
_SESSION_PROCESSES: dict[str, list] = {}


def stopped_when_not_asked_for(fixture: str, process) -> None:
    """Register `process` (with `start()`, `stop()` and `proc`) as the one `fixture` gives."""
    _SESSION_PROCESSES.setdefault(fixture, []).append(process)


def _running(process) -> bool:
    return process.proc is not None and process.proc.poll() is None


@pytest.fixture(autouse=True)
def session_processes_only_where_asked(request):
    for fixture, processes in _SESSION_PROCESSES.items():
        wanted = fixture in request.fixturenames
        for process in processes:
            if wanted and not _running(process):
                process.start()
            elif not wanted and _running(process):
                process.stop()


@pytest.fixture(scope="module")
def without_workers():
    """No real worker consumes this module's messages, from its module-scoped fixtures on: the
    session's worker group, if an earlier test in this process started one, is stopped (a test
    that asks for `workers` starts it again). For tests that drive a step themselves and count
    what it does: a worker taking their step's message first would do the work instead."""
    for group in _SESSION_PROCESSES.get("workers", []):
        if _running(group):
            group.stop()


@pytest.fixture(scope="session")
def workers(django_db_setup, django_db_blocker):
    """The test process's real Celery worker group (tests/integration/conftest.py), defined once
    here for every folder: a second definition (a conftest importing this one) would start a
    second group on the same queues, which a test that stops "the" workers would not stop."""
    from tests.integration.conftest import (
        WorkerGroup,  # the integration helpers load Django's models
    )

    group = WorkerGroup(f"itest-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}")
    group.start()
    stopped_when_not_asked_for("workers", group)
    yield group
    group.stop()


# The attestation keys processes registered (orchestrator.engine.attestation), by key id.
_ATTESTATION_KEYS: dict[str, dict] = {}


@pytest.fixture(autouse=True)
def attestation_keys_outlive_the_test_database(request):
    """A deployment's key table outlives its runs; a test database does not (a transactional
    test's tables are emptied after it, another test's rows rolled back). Every process of the
    session — this one, the real workers — registered its key once, as it signed its first
    record: each test that uses the database starts with the keys registered before it."""
    marker = request.node.get_closest_marker("django_db")
    if marker is None and not {"db", "transactional_db"} & set(request.fixturenames):
        yield
        return
    from orchestrator.models import WorkerKey  # Django's apps are loaded once a test runs

    if marker is None:
        request.getfixturevalue("db" if "db" in request.fixturenames else "transactional_db")
    try:
        # One statement for every key, not a lookup per key: tests after many worker restarts
        # would otherwise each spend dozens of queries here.
        WorkerKey.objects.bulk_create([WorkerKey(**row) for row in _ATTESTATION_KEYS.values()],
                                      ignore_conflicts=True)
    except RuntimeError:  # a `db` fixture of the test's own (tests/tools/test_sql.py): no Django database
        yield
        return
    yield
    try:
        _ATTESTATION_KEYS.update({row["key_id"]: row
                                  for row in WorkerKey.objects.filter(revoked_at=None).values()})
    except Exception:  # noqa: BLE001 - a test that broke its connection: nothing more to keep
        pass
