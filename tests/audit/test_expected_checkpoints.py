"""A hard anchor: `audit_verify` fails when a signed checkpoint is expected and missing, so
removing the newest checkpoint file no longer hides a rewritten history.

A checkpoint is expected when the database notes it as written (`CheckpointRecord`) and, even
with that note deleted, when entries older than AUDIT_CHECKPOINT_INTERVAL_S +
AUDIT_CHECKPOINT_GRACE_S are covered by no checkpoint. Each attack is done as someone with
write access to the database and to the checkpoint directory would (tests/audit/conftest.py).
"""
import pytest
from django.core.management import CommandError, call_command

from audit.chain import verify_ledger
from audit.models import CheckpointRecord

from .test_anchoring import checkpoint_files, record, rewrite_and_rechain

# They count the ledger's entries from its first: the ledger is append-only and outlives test
# flushes, so they run with the other `ledger_prefix` tests, first in a session without xdist.
pytestmark = [pytest.mark.django_db, pytest.mark.ledger_prefix]
EXPECTED = "a signed checkpoint is expected and missing"


def verify_fails(*args) -> str:
    with pytest.raises(CommandError) as caught:
        call_command("audit_verify", *args)
    return str(caught.value)


@pytest.fixture
def two_checkpoints():
    """Three entries, a checkpoint, three more, a second checkpoint: (entries, files)."""
    before = record(3)
    call_command("audit_checkpoint")
    after = record(3)
    call_command("audit_checkpoint")
    return before + after, checkpoint_files()


def test_a_rewritten_and_rechained_ledger_fails_with_and_without_its_latest_checkpoint_file(
        two_checkpoints):
    entries, (first_file, latest_file) = two_checkpoints
    rewrite_and_rechain(entries[4], payload='{"i":1,"note":"refund approved"}')
    assert verify_ledger().ok  # the chain alone no longer shows it

    assert "history was rewritten" in verify_fails()
    assert latest_file.name in verify_fails()

    latest_file.unlink()  # the one checkpoint that covers the rewrite, removed
    message = verify_fails()
    assert EXPECTED in message
    assert (f"{latest_file.name}, the checkpoint of sequence {entries[-1].sequence} written "
            in message)
    assert "--allow-missing-checkpoint accepts this" in message


def test_it_still_fails_when_the_database_note_of_the_latest_checkpoint_is_deleted_too(
        two_checkpoints, move_clock, settings):
    entries, (first_file, latest_file) = two_checkpoints
    window = settings.AUDIT_CHECKPOINT_INTERVAL_S + settings.AUDIT_CHECKPOINT_GRACE_S
    move_clock(window + 1)  # the rewrite is found later than the interval allows
    rewrite_and_rechain(entries[4], actor="user:mallory")
    latest_file.unlink()
    CheckpointRecord.objects.filter(name=latest_file.name).delete()

    message = verify_fails()
    assert EXPECTED in message
    assert (f"entries {entries[3].sequence}..{entries[-1].sequence} are covered by no signed "
            "checkpoint") in message
    assert f"more than {window:g} s ago" in message


def test_a_rewrite_before_an_earlier_checkpoint_is_caught_by_that_checkpoint(two_checkpoints):
    entries, (first_file, latest_file) = two_checkpoints
    rewrite_and_rechain(entries[1], outcome="approved")
    latest_file.unlink()
    CheckpointRecord.objects.filter(name=latest_file.name).delete()

    message = verify_fails("--allow-missing-checkpoint")  # even accepting a missing one
    assert "history was rewritten" in message and first_file.name in message


def test_a_removed_checkpoint_fails_until_its_absence_is_accepted_explicitly(two_checkpoints, capsys):
    entries, (first_file, latest_file) = two_checkpoints
    call_command("audit_verify")
    assert "matches 2 signed checkpoint(s)" in capsys.readouterr().out

    first_file.unlink()
    assert f"{first_file.name}, the checkpoint of sequence {entries[2].sequence}" in verify_fails()

    call_command("audit_verify", "--allow-missing-checkpoint")
    out, err = capsys.readouterr()
    assert "OK, 6 entries" in out
    assert f"WARNING: accepted (--allow-missing-checkpoint): {first_file.name}" in err


def test_entries_older_than_the_interval_with_no_checkpoint_at_all_fail(move_clock, settings, capsys):
    settings.AUDIT_CHECKPOINT_INTERVAL_S, settings.AUDIT_CHECKPOINT_GRACE_S = 60, 30
    entries = record(2)

    move_clock(90)  # within the interval and its grace: the schedule may not have run yet
    call_command("audit_verify")
    assert "no signed checkpoint of the ledger in directory" in capsys.readouterr().err

    move_clock(91)
    message = verify_fails()
    assert EXPECTED in message
    assert f"entries {entries[0].sequence}..{entries[1].sequence} are covered by no" in message
    assert "is the audit worker running" in message

    call_command("audit_checkpoint")  # the worker catches up: anchored again
    call_command("audit_verify")


def test_a_checkpoint_written_to_another_store_is_missing_from_this_one(two_checkpoints, settings,
                                                                         tmp_path):
    settings.AUDIT_CHECKPOINT_DIR = tmp_path / "moved"
    message = verify_fails()
    assert EXPECTED in message and f"is missing from directory {tmp_path / 'moved'}" in message
    assert f"to directory {tmp_path / 'audit-checkpoints'}" in message
