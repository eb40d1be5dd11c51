"""Retention: pruning is explicit, audited, limited to what a checkpoint covers, and leaves a
chain that still verifies."""
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from audit import anchoring, chain
from audit.chain import verify_ledger
from audit.models import AuditEntry
from audit.services import audit_prune
from audit.triggers import SQLITE_NO_DELETE
from audit.verification import ledger_check, ledger_verification_request, ledger_verification_run
from orchestrator.engine import clock
from orchestrator.engine.hashing import canonical_json

from .conftest import ledger
from .test_anchoring import rewrite_and_rechain
from .test_shards import chain_of, postgresql_only, record, subject_in

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


# --- a sharded ledger (PostgreSQL: SQLite keeps one shard) ----------------------------------------


@pytest.fixture
def sharded_history(settings, monkeypatch, auditor):
    """Shard 5: three entries 400 days old, then one today; shard 9: three old ones; shard 12:
    one today; shard 0: `old_and_new`'s. A verification passed over the old ones, behind a
    signed checkpoint of their heads."""
    settings.AUDIT_LEDGER_SHARDS = 16
    today = clock.now()
    monkeypatch.setattr(clock, "_source", lambda: today - timedelta(days=400))
    with transaction.atomic():
        for n in range(3):
            record(subject_in(5), n)
            record(subject_in(9), n)
    anchoring.checkpoint_write(reason="test")
    verified = ledger_verification_run(verification_id=ledger_verification_request(actor=auditor).pk)
    assert verified.state == "passed", verified.result
    monkeypatch.setattr(clock, "_source", lambda: today)
    with transaction.atomic():
        record(subject_in(5), 3)
        record(subject_in(12), 0)
    return today


@postgresql_only
def test_every_shards_old_prefix_is_pruned_and_every_chain_still_verifies(old_and_new, sharded_history):
    result = audit_prune(before=sharded_history - timedelta(days=365), actor="user:compliance")

    assert {shard: (part.first, part.through) for shard, part in result.shards.items() if shard} == {
        5: (1, 3), 9: (1, 2)}  # shard 9 keeps its head, the entry its next one links to
    assert [entry.sequence for entry in chain_of(5)] == [4]
    assert [entry.sequence for entry in chain_of(9)] == [3]
    assert [entry.sequence for entry in chain_of(12)] == [1]
    [checkpoint] = ledger(action=chain.PRUNE_ACTION)
    assert checkpoint.data["shards"] == {
        "5": {"through_sequence": 3, "through_hash": result.shards[5].through_hash, "from_sequence": 1,
              "deleted": 3},
        "9": {"through_sequence": 2, "through_hash": result.shards[9].through_hash, "from_sequence": 1,
              "deleted": 2}}
    assert checkpoint.data["through_sequence"] == result.through_sequence == old_and_new[0][-1].sequence
    assert verify_ledger().ok
    assert ledger_check().ok, ledger_check().message
    # The verification that passed was anchored at heads the prune has since deleted.
    incremental = ledger_check(incremental=True)
    assert incremental.ok and incremental.mode == "incremental", incremental.message

    record(subject_in(9), 3)
    assert [(entry.sequence, entry.prev_hash) for entry in chain_of(9)][1] == (4, chain_of(9)[0].hash)
    assert verify_ledger().ok


@postgresql_only
def test_a_later_prune_keeps_the_anchors_of_the_shards_it_leaves_alone(old_and_new, sharded_history, monkeypatch):
    audit_prune(before=sharded_history - timedelta(days=365), actor="user:x")
    # A year on, shards 0 and 5 have entries to prune, 9 and 12 only their heads: shard 0's
    # prune removes the first prune's entry, whose anchor of shard 9 the second one carries.
    monkeypatch.setattr(clock, "_source", lambda: sharded_history + timedelta(days=400))
    with transaction.atomic():
        record(subject_in(5), 4)
    result = audit_prune(before=sharded_history + timedelta(days=35), actor="user:x")

    assert set(result.shards) == {0, 5}
    [second] = ledger(action=chain.PRUNE_ACTION)
    assert second.data["shards"]["9"] == {"through_sequence": 2,
                                          "through_hash": second.data["shards"]["9"]["through_hash"]}
    assert verify_ledger().ok


@postgresql_only
def test_a_prune_deletes_nothing_another_shards_anchor_would_cover(old_and_new, sharded_history):
    audit_prune(before=sharded_history - timedelta(days=365), actor="user:x")
    # Shard 0's anchor (about 8) and shard 5's (3) do not reach shard 12's only entry, sequence 1.
    [entry] = chain_of(12)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL stepwise.audit_prune = 'on'")
            cursor.execute("DELETE FROM audit_entry WHERE id = %s", [entry.id])


@postgresql_only
def test_a_shards_pruned_prefix_without_its_anchor_is_reported(old_and_new, sharded_history):
    audit_prune(before=sharded_history - timedelta(days=365), actor="user:x")
    [checkpoint] = ledger(action=chain.PRUNE_ACTION)
    data = checkpoint.data
    del data["shards"]["9"]
    # Shard 0 rewritten from the prune's entry on, its digests and links recomputed, so that
    # only shard 9's missing anchor is left to find.
    rewrite_and_rechain(checkpoint, payload=canonical_json(data))

    report = verify_ledger()
    assert not report.ok and report.broken.shard == 9 and "no prune checkpoint" in report.broken.reason
