"""Anchoring: signed checkpoints of the chain head, out of the database, catch what the chain
alone cannot — a history edited and re-chained with the triggers dropped, and a deleted tail.

Each attack is done the way someone with write access to the database would: drop (or
disable) the ledger's triggers, change rows with SQL, recompute the chain, restore the
triggers. The chain alone then verifies again (asserted, so the attack is real); the
checkpoints written before it — by `audit_export` or by the beat task — do not.
"""
import hashlib
import json
from pathlib import Path

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import connection, transaction

from audit.chain import content_digest, entry_row, link_hash, verify_ledger
from audit.export import FIELDS, manifest_path_for, read_rows, verify_export
from audit.models import GENESIS_HASH, AuditEntry
from audit.services import audit_record
from audit.triggers import missing_guards
from orchestrator.celery import app as celery_app

from .conftest import ledger, triggers_bypassed

pytestmark = pytest.mark.django_db


def record(n: int, **payload) -> list[AuditEntry]:
    with transaction.atomic():
        [audit_record(action="test.event", actor="service:test", subject_type="ledger",
                      subject_id=i, payload={"i": i, **payload}) for i in range(n)]
    return ledger()[-n:]


def export(tmp_path: Path, name: str = "ledger.jsonl") -> dict:
    path = tmp_path / name
    call_command("audit_export", "--from", "2000-01-01", "--output", str(path))
    return json.loads(manifest_path_for(path).read_text())


def checkpoint_files() -> list[Path]:
    return sorted(Path(settings.AUDIT_CHECKPOINT_DIR).glob("checkpoint-*.json"))


def rewrite_and_rechain(entry: AuditEntry, **changes) -> None:
    """Drop the triggers, edit `entry`, recompute every digest and hash from it to its shard's
    head, restore the triggers: what a database owner can do to make the chain consistent again."""
    with triggers_bypassed(), connection.cursor() as cursor:
        for column, value in changes.items():
            cursor.execute(f"UPDATE audit_entry SET {column} = %s WHERE id = %s", [value, entry.id])
        chain = AuditEntry.objects.filter(shard=entry.shard)
        previous = (chain.filter(sequence=entry.sequence - 1)
                    .values_list("hash", flat=True).first() or GENESIS_HASH)
        for row in chain.filter(sequence__gte=entry.sequence).order_by("sequence"):
            digest = content_digest(entry_row(row))
            linked = link_hash(previous, row.sequence, digest)
            cursor.execute("UPDATE audit_entry SET digest = %s, prev_hash = %s, hash = %s "
                           "WHERE id = %s", [digest, previous, linked, row.id])
            previous = linked
    assert missing_guards() == []


def delete_newest(count: int) -> None:
    """Drop the triggers, delete the newest `count` entries, restore the triggers."""
    newest = list(AuditEntry.objects.order_by("-sequence").values_list("id", flat=True)[:count])
    with triggers_bypassed(), connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM audit_entry WHERE id IN ({','.join(['%s'] * count)})", newest)
    assert missing_guards() == []


def test_an_edited_and_rechained_history_fails_audit_verify_against_the_exports_checkpoint(tmp_path):
    entries = record(5)
    manifest = export(tmp_path)
    call_command("audit_verify")

    rewrite_and_rechain(entries[1], payload='{"i":1,"note":"refund approved"}')

    assert verify_ledger().ok  # the chain alone no longer shows it
    with pytest.raises(CommandError) as caught:
        call_command("audit_verify")
    message = str(caught.value)
    assert manifest["checkpoint"]["sequence"] == entries[-1].sequence
    assert "history was rewritten" in message
    assert f"the entry at sequence {entries[-1].sequence} has hash" in message
    assert checkpoint_files()[-1].name in message


def test_a_rewrite_is_located_between_the_checkpoint_it_still_matches_and_the_first_it_breaks():
    before = record(3)
    call_command("audit_checkpoint")
    after = record(3)
    call_command("audit_checkpoint")
    first_file, second_file = checkpoint_files()

    rewrite_and_rechain(after[1], actor="user:mallory")

    with pytest.raises(CommandError) as caught:
        call_command("audit_verify")
    message = str(caught.value)
    assert f"{second_file.name}" in message
    assert f"still matches checkpoint {first_file.name}" in message
    assert f"sequences {before[-1].sequence + 1}..{after[-1].sequence}" in message


def test_deleting_the_newest_entries_fails_audit_verify_as_a_truncated_tail(tmp_path):
    entries = record(5)
    export(tmp_path)

    delete_newest(2)

    assert verify_ledger().ok  # a shorter chain is still a consistent chain
    with pytest.raises(CommandError) as caught:
        call_command("audit_verify")
    message = str(caught.value)
    assert "the tail was truncated" in message
    assert f"ends at sequence {entries[2].sequence}" in message
    assert f"entries {entries[3].sequence}..{entries[4].sequence} were deleted" in message
    assert checkpoint_files()[-1].name in message


def test_beat_polls_a_thin_task_that_checkpoints_the_head_every_interval_or_n_entries(
        settings, move_clock):
    entry = settings.CELERY_BEAT_SCHEDULE["stepwise-audit-checkpoint"]
    assert entry["task"] == "audit.tasks.checkpoint" and entry["options"]["queue"] == "audit"
    assert entry["schedule"] < settings.AUDIT_CHECKPOINT_INTERVAL_S
    celery_app.loader.import_default_modules()  # what a worker does at start: autodiscovery
    task = celery_app.tasks["audit.tasks.checkpoint"]
    settings.AUDIT_CHECKPOINT_INTERVAL_S, settings.AUDIT_CHECKPOINT_ENTRIES = 60, 5
    entries = record(2)

    task()  # never checkpointed: due at once
    task()  # the head did not move: nothing new to sign
    assert len(checkpoint_files()) == 1
    written = json.loads(checkpoint_files()[0].read_text())
    assert (written["sequence"], written["hash"]) == (entries[-1].sequence, entries[-1].hash)
    assert written["reason"] == "schedule" and written["key_id"].startswith("ed25519:")

    record(1)
    move_clock(59)
    task()  # one entry, 59 s: not due yet
    assert len(checkpoint_files()) == 1
    move_clock(60)
    task()  # the interval
    assert len(checkpoint_files()) == 2

    record(5)
    task()  # N entries, before the interval
    assert len(checkpoint_files()) == 3

    record(1)
    task(at_start=True)  # at start: whenever the head moved
    assert len(checkpoint_files()) == 4
    assert json.loads(checkpoint_files()[-1].read_text())["reason"] == "start"
    task(at_start=True)
    assert len(checkpoint_files()) == 4

    delete_newest(1)
    with pytest.raises(CommandError, match="the tail was truncated"):
        call_command("audit_verify")


def test_a_checkpoint_edited_to_match_a_rewritten_ledger_fails_its_signature():
    entries = record(3)
    call_command("audit_checkpoint")
    rewrite_and_rechain(entries[0], outcome="approved")
    [path] = checkpoint_files()
    document = json.loads(path.read_text())
    document["hash"] = AuditEntry.objects.get(sequence=document["sequence"]).hash
    path.write_text(json.dumps(document))

    with pytest.raises(CommandError, match="the signature does not verify"):
        call_command("audit_verify")


def test_after_a_key_rotation_old_checkpoints_verify_with_the_old_public_key(tmp_path, settings, capsys):
    from audit.signing import key_id, public_key_text, signing_key

    record(2)
    call_command("audit_checkpoint")
    old = signing_key().public_key()
    settings.AUDIT_SIGNING_KEY_FILE = str(tmp_path / "new-key.pem")
    call_command("audit_keygen", "--output", settings.AUDIT_SIGNING_KEY_FILE)

    with pytest.raises(CommandError, match=f"signed by {key_id(old)}, which is not a trusted key"):
        call_command("audit_verify")

    settings.AUDIT_VERIFY_KEYS = [public_key_text(old)]
    record(1)
    call_command("audit_checkpoint")
    capsys.readouterr()
    call_command("audit_verify")
    assert "matches 2 signed checkpoint(s)" in capsys.readouterr().out


def test_production_never_signs_without_a_configured_key(settings, tmp_path):
    from audit.anchoring import checkpoint_write

    record(1)
    settings.PRODUCTION, settings.AUDIT_SIGNING_KEY_FILE = True, ""
    with pytest.raises(ImproperlyConfigured, match="AUDIT_SIGNING_KEY_FILE is not set"):
        checkpoint_write(reason="manual")
    with pytest.raises(CommandError, match="AUDIT_SIGNING_KEY_FILE is not set"):
        call_command("audit_export", "--from", "2000-01-01", "--output", str(tmp_path / "x.jsonl"))
    assert checkpoint_files() == []


def test_an_export_rewritten_whole_fails_against_the_checkpoint_its_manifest_carries(tmp_path):
    """Entries edited in the file, the chain recomputed, the manifest's hashes and SHA updated:
    only the signature over the head, which needs the key, is left to catch it."""
    record(3)
    manifest = export(tmp_path)
    path = tmp_path / "ledger.jsonl"
    assert verify_export(path)[1] == []

    rows = list(read_rows(path, "jsonl"))
    rows[-2]["actor"] = "user:mallory"
    previous = rows[0]["prev_hash"]
    for row in rows:
        row["digest"] = content_digest(row)
        row["prev_hash"], row["hash"] = previous, link_hash(previous, row["sequence"], row["digest"])
        previous = row["hash"]
    path.write_text("".join(json.dumps({k: row[k] for k in FIELDS}) + "\n" for row in rows))
    manifest.update(file_sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
                    export_head_hash=previous)
    manifest_path_for(path).write_text(json.dumps(manifest))

    report, problems = verify_export(path)
    assert report.ok
    assert problems == [f"the entry at sequence {rows[-1]['sequence']} does not have the hash the "
                        "manifest's checkpoint signed (the export was rewritten)"]

    manifest["checkpoint"]["hash"] = manifest["ledger_head"]["hash"] = previous
    manifest_path_for(path).write_text(json.dumps(manifest))
    assert "the signature does not verify" in verify_export(path)[1][0]
