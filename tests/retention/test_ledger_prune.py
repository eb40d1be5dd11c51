"""The ledger is pruned only behind a signed checkpoint, what it deletes is exported to the
archive storage first when one is configured, and `audit_verify` passes afterwards."""
import json
from datetime import timedelta

import pytest
from django.core.management import call_command

from audit.chain import chain_head
from audit.models import AuditEntry, CheckpointRecord
from audit.services import audit_prune
from orchestrator.engine import clock
from tests.audit.conftest import ledger

# The ledger is append-only and outlives test flushes: like tests/audit/test_prune.py, these
# run first in a session of their own.
pytestmark = [pytest.mark.django_db, pytest.mark.ledger_prefix]


@pytest.fixture
def archive(settings, tmp_path):
    settings.STORAGES = {**settings.STORAGES, "audit_archive": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": tmp_path / "archive"}}}
    return tmp_path / "archive"


def test_a_prune_archives_what_it_deletes_first_and_signs_before_and_after(
        old_and_new, archive, capsys):
    old, new = old_and_new
    result = audit_prune(before=clock.now() - timedelta(days=365), actor="user:compliance")

    assert result.deleted == len(old) and result.through_sequence == old[-1].sequence
    assert not AuditEntry.objects.filter(action="test.old").exists()
    # The archive holds exactly what was deleted, with a manifest that verifies offline.
    exported = archive / result.archive
    rows = [json.loads(line) for line in exported.read_text().splitlines()]
    assert [row["sequence"] for row in rows] == [e.sequence for e in old]
    assert [row["hash"] for row in rows] == [e.hash for e in old]
    call_command("audit_verify", "--export", str(exported))
    assert f"OK, {len(old)} entries" in capsys.readouterr().out
    assert result.checkpoint.data["archive"] == result.archive

    # Signed before the deletion (covering it) and after it (the prune's own entry).
    reasons = dict(CheckpointRecord.objects.values_list("reason", "sequence"))
    assert reasons["export"] >= old[-1].sequence
    assert reasons["pruned"] == chain_head()[0] == ledger(action="audit.pruned")[-1].sequence
    call_command("audit_verify")
    assert "audit ledger: OK" in capsys.readouterr().out


def test_without_an_archive_the_prune_writes_its_own_checkpoint_before_deleting(old_and_new, capsys):
    old, _new = old_and_new
    result = audit_prune(before=clock.now() - timedelta(days=365), actor="user:compliance")
    assert result.deleted == len(old) and result.archive == ""
    reasons = dict(CheckpointRecord.objects.values_list("reason", "sequence"))
    assert reasons["prune"] >= old[-1].sequence and reasons["pruned"] == chain_head()[0]
    call_command("audit_verify")
    assert "audit ledger: OK" in capsys.readouterr().out


def test_an_unwritable_archive_leaves_the_ledger_unpruned(old_and_new, settings, tmp_path):
    old, _new = old_and_new
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where the archive directory should be")
    settings.STORAGES = {**settings.STORAGES, "audit_archive": {
        "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": blocked}}}
    with pytest.raises(OSError):
        audit_prune(before=clock.now() - timedelta(days=365), actor="user:compliance")
    assert AuditEntry.objects.filter(action="test.old").count() == len(old)
    assert not ledger(action="audit.pruned")
