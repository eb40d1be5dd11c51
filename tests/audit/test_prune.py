"""Retention: pruning is explicit, audited, limited to what a checkpoint covers, and leaves a
chain that still verifies."""
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from audit import chain
from audit.chain import verify_ledger
from audit.models import AuditEntry
from audit.services import audit_prune
from audit.triggers import SQLITE_NO_DELETE
from orchestrator.engine import clock

from .conftest import ledger

# The ledger is append-only and outlives test flushes, so these run first in a session of their
# own (`make test`: the `ledger_prefix` tests, the API fuzzer and on the embedded default the
# fault suite, without xdist).
pytestmark = [pytest.mark.django_db, pytest.mark.ledger_prefix]


def test_pruning_deletes_the_old_prefix_and_leaves_a_checkpoint_that_anchors_the_rest(old_and_new):
    old, new = old_and_new
    head_before = ledger()[-1]

    result = audit_prune(before=clock.now() - timedelta(days=365), actor="user:compliance")

    # pytest-django runs these (rolled back) tests before any test that commits, so the old
    # entries are the start of the ledger here.
    assert (result.deleted, result.through_sequence) == (5, old[-1].sequence)
    assert not AuditEntry.objects.filter(action="test.old").exists()
    assert AuditEntry.objects.filter(action="test.new").count() == 3
    [checkpoint] = ledger(action=chain.PRUNE_ACTION)
    assert checkpoint.actor == "user:compliance"
    assert checkpoint.data["through_sequence"] == old[-1].sequence
    assert checkpoint.data["through_hash"] == old[-1].hash
    assert checkpoint.prev_hash == head_before.hash  # the checkpoint itself is chained
    report = verify_ledger()
    assert report.ok, report.broken


def test_a_dry_run_deletes_nothing(old_and_new):
    before = AuditEntry.objects.count()
    result = audit_prune(before=clock.now() - timedelta(days=365), actor="user:x", dry_run=True)
    assert result.deleted >= 5 and AuditEntry.objects.count() == before


def test_entries_no_checkpoint_covers_stay_undeletable_even_during_a_prune(old_and_new):
    _, new = old_and_new
    chain.seal_pending()
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SET LOCAL stepwise.audit_prune = 'on'")
            else:
                cursor.execute("DROP TRIGGER audit_entry_no_delete")
            cursor.execute("DELETE FROM audit_entry WHERE id = %s", [new[0].id])
    assert AuditEntry.objects.filter(id=new[0].id).exists()


def test_the_delete_guard_is_back_after_a_prune(old_and_new):
    audit_prune(before=clock.now() - timedelta(days=365), actor="user:x")

    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEntry.objects.filter(action="test.new").delete()
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("SELECT sql FROM sqlite_master WHERE name = 'audit_entry_no_delete'")
            assert cursor.fetchone()[0] == SQLITE_NO_DELETE


def test_a_pruned_prefix_without_its_checkpoint_is_reported(old_and_new):
    from .conftest import tamper

    audit_prune(before=clock.now() - timedelta(days=365), actor="user:x")
    checkpoint = ledger(action=chain.PRUNE_ACTION)[0]
    tamper("UPDATE audit_entry SET payload = %s WHERE id = %s",
           ['{"through_sequence":0,"through_hash":"x"}', checkpoint.id])

    report = verify_ledger()
    assert not report.ok and "no prune checkpoint" in report.broken.reason


def test_the_command_needs_a_retention_period(settings):
    settings.AUDIT_RETENTION_DAYS = None
    with pytest.raises(CommandError, match="unlimited"):
        call_command("audit_prune")


def test_the_command_applies_the_configured_retention(old_and_new, settings, capsys):
    settings.AUDIT_RETENTION_DAYS = 365
    call_command("audit_prune", "--dry-run")
    assert "would delete" in capsys.readouterr().out
    call_command("audit_prune", "--actor", "user:compliance")
    assert "checkpoint entry" in capsys.readouterr().out
    assert not AuditEntry.objects.filter(action="test.old").exists()
    call_command("audit_verify")
