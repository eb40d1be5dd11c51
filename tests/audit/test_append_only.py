"""The database itself refuses to change or remove ledger entries."""
import re

import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction

from audit.models import AuditEntry
from audit.services import audit_record
from audit.triggers import SQLITE_NO_DELETE

from .conftest import ledger

pytestmark = pytest.mark.django_db


@pytest.fixture
def entry() -> AuditEntry:
    with transaction.atomic():
        audit_record(action="test.event", actor="service:test", subject_type="ledger", subject_id=1,
                     payload={"kept": True})
    return ledger(action="test.event")[-1]


def refused(statement, params=()) -> str:
    with pytest.raises(DatabaseError) as caught, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(statement, params)
    return str(caught.value)


@pytest.mark.parametrize("statement", [
    "UPDATE audit_entry SET outcome = 'forged' WHERE id = %s",
    "UPDATE audit_entry SET payload = '{}' WHERE id = %s",
    "UPDATE audit_entry SET hash = NULL, sequence = NULL WHERE id = %s",
])
def test_update_fails_at_the_database(entry, statement):
    assert "append-only" in refused(statement, [entry.id])
    entry.refresh_from_db()
    assert entry.outcome == "" and entry.data == {"kept": True}


def test_delete_fails_at_the_database(entry):
    assert "append-only" in refused("DELETE FROM audit_entry WHERE id = %s", [entry.id])
    assert "append-only" in refused("DELETE FROM audit_entry")
    assert AuditEntry.objects.filter(id=entry.id).exists()


def test_the_orm_cannot_change_or_delete_entries_either(entry):
    with pytest.raises(DatabaseError), transaction.atomic():
        AuditEntry.objects.filter(id=entry.id).update(actor="user:mallory")
    with pytest.raises(DatabaseError), transaction.atomic():
        entry.delete()
    with pytest.raises(DatabaseError), transaction.atomic():
        entry.outcome = "forged"
        entry.save()
    assert AuditEntry.objects.get(id=entry.id).actor == "service:test"


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_truncate_fails_at_the_database(entry):
    assert "TRUNCATE refused" in refused("TRUNCATE audit_entry")


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_an_insert_cannot_choose_its_own_place_in_the_chain():
    with transaction.atomic():
        forged = audit_record(action="test.event", actor="service:test", subject_type="ledger",
                              subject_id=2)
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO audit_entry (created_at, actor, actor_kind, action, subject_type,"
                       " subject_id, team, workflow, definition_digest, step_name, proposal_hash,"
                       " model, prompt_version, idempotency_key, correlation_id, outcome, payload,"
                       " payload_ref, digest, sequence, prev_hash, hash) SELECT created_at, actor,"
                       " actor_kind, action, subject_type, subject_id, team, workflow,"
                       " definition_digest, step_name, proposal_hash, model, prompt_version,"
                       " idempotency_key, correlation_id, outcome, payload, payload_ref, digest,"
                       " 999999, 'x', 'y' FROM audit_entry WHERE id = %s", [forged.id])
    entries = ledger(action="test.event")
    assert 999999 not in [e.sequence for e in entries]
    assert entries[-1].sequence == entries[-2].sequence + 1


def test_the_ledger_is_not_managed_so_flush_leaves_it_alone(entry):
    """`manage.py flush` (and every transactional test's teardown) skips unmanaged tables."""
    assert AuditEntry._meta.managed is False
    call_command("flush", interactive=False, verbosity=0)
    assert AuditEntry.objects.filter(id=entry.id).exists()


@pytest.mark.skipif("connection.vendor != 'sqlite'")
def test_the_runtime_copy_of_the_sqlite_delete_guard_matches_the_migration():
    with connection.cursor() as cursor:
        cursor.execute("SELECT sql FROM sqlite_master WHERE name = 'audit_entry_no_delete'")
        [(installed,)] = cursor.fetchall()
    assert re.sub(r"\s+", " ", installed) == SQLITE_NO_DELETE


def test_audit_verify_warns_when_a_guard_is_switched_off(entry, capsys, settings):
    from .conftest import triggers_bypassed

    # Entries earlier tests committed outlive their flush on PostgreSQL, with no checkpoint in
    # this test's directory: the guards are what is checked here, not the anchor.
    settings.AUDIT_CHECKPOINT_GRACE_S = 10**9
    call_command("audit_verify")
    assert "is missing or disabled" not in capsys.readouterr().err
    with triggers_bypassed():
        call_command("audit_verify")
    assert "is missing or disabled" in capsys.readouterr().err
