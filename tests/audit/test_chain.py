"""Tamper evidence: the chain is linear, audit_verify passes on a clean ledger and names the
first broken link of a hand-edited one."""
import re
import threading
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.core.management import CommandError, call_command
from django.db import close_old_connections, connection, transaction

from audit.anchoring import checkpoint_write
from audit.chain import (
    PRUNE_ACTION,
    Break,
    Report,
    canonical_json,
    content_digest,
    entry_row,
    link_hash,
    sha256_hex,
    timestamp_text,
    verify_ledger,
    verify_rows,
)
from audit.models import GENESIS_HASH, AuditEntry
from audit.services import audit_prune, audit_record
from orchestrator.engine import clock

from .conftest import ledger, tamper

pytestmark = pytest.mark.django_db


def record(n: int, **payload) -> list[AuditEntry]:
    with transaction.atomic():
        return [audit_record(action="test.event", actor="service:test", subject_type="ledger",
                             subject_id=i, payload={"i": i, **payload}) for i in range(n)]


def append(i: int) -> AuditEntry:
    return audit_record(action="test.event", actor="service:test", subject_type="ledger",
                        subject_id=i, payload={"i": i})


class Undone(Exception):
    pass


def test_an_append_undone_with_its_savepoint_is_not_linked_to():
    """The head carried from append to append within a transaction (SQLite) forgets an entry
    whose savepoint rolled back; the next entry links to the one before it."""
    with transaction.atomic():
        kept = append(1)
        with pytest.raises(Undone), transaction.atomic():
            append(2)
            raise Undone
        after = append(3)
        with transaction.atomic():  # a savepoint that commits keeps the carried head
            last = append(4)

    assert [e.subject_id for e in ledger()][-3:] == ["1", "3", "4"]
    assert verify_ledger().ok
    after.refresh_from_db(), kept.refresh_from_db(), last.refresh_from_db()
    assert (after.prev_hash, after.sequence) == (kept.hash, kept.sequence + 1)
    assert (last.prev_hash, last.sequence) == (after.hash, after.sequence + 1)


def test_one_transactions_entries_are_appended_in_one_statement():
    from django.test.utils import CaptureQueriesContext

    from orchestrator.engine.events import events_record
    from orchestrator.models import Event

    run = ledger_run()
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        events_record([Event(run=run, kind="run.noted", actor="service:test") for _ in range(3)])
    inserts = [q["sql"] for q in queries.captured_queries if q["sql"].startswith('INSERT INTO "audit_entry"')]

    assert len(inserts) == 1
    assert [e.action for e in ledger(run_id=run.id)][-3:] == ["run.noted"] * 3
    assert verify_ledger().ok


def ledger_run():
    from orchestrator.engine.authz import System
    from orchestrator.engine.services.runs import run_start
    from orchestrator.engine.services.workflows import workflow_save
    from tests.factories import TeamFactory

    version, _ = workflow_save(team=TeamFactory(slug="ledger"), definition={
        "name": "noted", "input_schema": {"type": "object"}, "steps": [
            {"name": "a", "type": "tool", "tool": "core.echo"}]}, actor=System("test"))
    return run_start(version=version, input={}, actor=System("test"))


def test_an_entry_read_with_fields_deferred_gives_the_same_row():
    record(1, detail="deferred")
    whole = ledger()[-1]
    partial = AuditEntry.objects.only("id", "actor").get(id=whole.id)
    assert partial.get_deferred_fields()
    assert entry_row(partial) == entry_row(whole)
    assert content_digest(entry_row(partial)) == whole.digest


def test_canonical_json_is_sorted_compact_and_ascii():
    assert canonical_json({"b": 1, "a": ["é", None]}) == '{"a":["\\u00e9",null],"b":1}'


def test_each_entry_links_to_the_previous_one():
    record(3)
    entries = ledger()

    assert [e.sequence for e in entries] == list(range(entries[0].sequence, entries[0].sequence + len(entries)))
    for before, entry in zip(entries, entries[1:], strict=False):
        assert entry.prev_hash == before.hash
    for entry in entries:
        assert entry.digest == content_digest(entry_row(entry))
        assert entry.hash == link_hash(entry.prev_hash, entry.sequence, entry.digest)
        assert entry.hash == sha256_hex(f"{entry.prev_hash}:{entry.sequence}:{entry.digest}")


@pytest.mark.ledger_prefix
def test_the_first_entry_of_an_empty_ledger_links_to_genesis():
    """Run with the other `ledger_prefix` tests, first in a session without xdist (`make test`),
    so the ledger is empty here; it fails rather than skips when it is not."""
    assert not AuditEntry.objects.exists(), "the ledger is not empty: run `pytest -m ledger_prefix` alone"
    first = ledger(id__in=[e.id for e in record(2)])[0]
    assert (first.sequence, first.prev_hash) == (1, GENESIS_HASH)
    assert first.hash == sha256_hex(f"{GENESIS_HASH}:1:{first.digest}")
    assert verify_ledger().ok


def test_audit_verify_passes_on_a_clean_ledger(support_run, capsys):
    # As the audit worker keeps it: earlier tests of this process may have written entries
    # older than a checkpoint's interval, which a ledger without a checkpoint would fail on.
    checkpoint_write(reason="schedule")
    call_command("audit_verify")

    out = capsys.readouterr().out
    assert "OK" in out and f"head {ledger()[-1].hash}" in out


@pytest.mark.parametrize("column, value", [
    ("payload", '{"i":1,"note":"edited"}'),
    ("actor", "user:mallory"),
    ("outcome", "approved"),
    ("created_at", "2001-01-01 00:00:00"),
])
def test_hand_editing_one_entry_is_caught_at_that_entry(column, value):
    entries = record(4)
    victim = entries[2]
    if connection.vendor == "postgresql" and column == "created_at":
        value = "2001-01-01 00:00:00+00"
    tamper(f"UPDATE audit_entry SET {column} = %s WHERE id = %s", [value, victim.id])

    report = verify_ledger()
    assert not report.ok
    victim.refresh_from_db()
    assert (report.broken.sequence, report.broken.entry_id) == (victim.sequence, victim.id)
    assert "edited" in report.broken.reason
    with pytest.raises(CommandError, match=f"BROKEN at sequence {victim.sequence} "):
        call_command("audit_verify")


def test_an_edit_that_recomputes_the_digest_is_caught_by_the_hash():
    victim = record(3)[1]
    forged = {**entry_row(AuditEntry.objects.get(id=victim.id)), "actor": "user:mallory"}
    tamper("UPDATE audit_entry SET actor = %s, digest = %s WHERE id = %s",
           ["user:mallory", content_digest(forged), victim.id])

    report = verify_ledger()
    assert report.broken.entry_id == victim.id
    assert "hash does not match" in report.broken.reason


def test_rewriting_an_entry_and_its_hash_is_caught_at_the_next_entry():
    entries = record(3)
    ledger()  # sealed
    victim = AuditEntry.objects.get(id=entries[1].id)
    forged = {**entry_row(victim), "actor": "user:mallory"}
    digest = content_digest(forged)
    tamper("UPDATE audit_entry SET actor = %s, digest = %s, hash = %s WHERE id = %s",
           ["user:mallory", digest, link_hash(victim.prev_hash, victim.sequence, digest), victim.id])

    report = verify_ledger()
    assert report.broken.entry_id == entries[2].id
    assert "prev_hash" in report.broken.reason


def test_a_deleted_entry_is_caught_where_the_gap_is():
    entries = record(4)
    ledger()
    after = AuditEntry.objects.get(id=entries[2].id)
    tamper("DELETE FROM audit_entry WHERE id = %s", [entries[1].id])

    report = verify_ledger()
    assert report.broken.entry_id == after.id
    assert "missing" in report.broken.reason


def test_verify_rows_reports_how_far_it_got():
    ids = [x.id for x in record(3)]
    rows = [{"id": e.id, **entry_row(e)} for e in ledger(id__in=ids)]

    report = verify_rows(rows, anchor=rows[0]["prev_hash"], start=rows[0]["sequence"])

    assert report.ok and report.count == 3
    assert (report.first_sequence, report.head_sequence) == (rows[0]["sequence"], rows[-1]["sequence"])
    assert report.head_hash == rows[-1]["hash"]


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_append_one_linear_chain():
    """Eight threads, each committing entries in its own transactions: no fork, no gap."""
    before = AuditEntry.objects.count()
    errors = []

    def writer(n: int) -> None:
        try:
            for i in range(5):
                with transaction.atomic():
                    audit_record(action="test.concurrent", actor=f"worker:w{n}",
                                 subject_type="ledger", subject_id=f"{n}-{i}")
        except Exception as exc:  # surfaced below
            errors.append(exc)
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert AuditEntry.objects.count() == before + 40
    report = verify_ledger()
    assert report.ok, report.broken
    assert AuditEntry.objects.filter(sequence__isnull=True).count() == 0


@pytest.mark.parametrize("zone", ["UTC", "Asia/Kolkata", "America/St_Johns"])
def test_an_entry_time_is_written_in_utc_whatever_the_time_zone(settings, zone):
    """The digest covers this text: it must not depend on the server's zone."""
    settings.TIME_ZONE = zone  # Django sets the process's zone (TZ) from it
    kolkata = datetime(2026, 1, 1, 17, 30, tzinfo=ZoneInfo("Asia/Kolkata"))
    assert timestamp_text(kolkata) == "2026-01-01T12:00:00.000000+00:00"
    assert timestamp_text(datetime(2026, 1, 1, 12, 0, 0, 7, tzinfo=UTC)) == "2026-01-01T12:00:00.000007+00:00"


# --- verify_ledger's other branches: an empty ledger, an unlinked entry, a pruned prefix ------
# Each starts from whatever the ledger holds (empty in a plain run; entries committed by other
# tests under mutmut) and changes it inside the test's transaction, which is rolled back.


def test_an_empty_ledger_verifies_with_nothing_counted():
    record(2)
    tamper("DELETE FROM audit_entry")

    assert verify_ledger() == Report(0, None, None, None, None)


def test_an_entry_never_linked_into_the_chain_is_reported_before_anything_else():
    first, unlinked = record(2)
    ledger()
    tamper("UPDATE audit_entry SET sequence = NULL, prev_hash = NULL, hash = NULL WHERE id = %s",
           [unlinked.id])

    report = verify_ledger()

    assert report == Report(0, None, None, None, Break(None, unlinked.id, "entry was never linked into the chain"))
    assert str(report.broken) == f"the ledger (entry id {unlinked.id}): entry was never linked into the chain"


def past_every_entry():
    """A cutoff after every entry, those other tests of this process recorded at a clock they
    moved forward included: a prune before it takes the whole ledger."""
    newest = AuditEntry.objects.order_by("-created_at").values_list("created_at", flat=True).first()
    return max(clock.now(), newest or clock.now()) + timedelta(days=1)


def test_a_ledger_pruned_to_its_checkpoint_verifies_from_the_checkpoint_on():
    record(3)
    head = ledger()[-1]
    audit_prune(before=past_every_entry(), actor="user:compliance")
    later = record(2)
    # Ids do not follow sequences (on PostgreSQL ids are taken at insert, sequences at commit):
    # verification must go by sequence alone.
    tamper("UPDATE audit_entry SET id = id + 100000")
    later = [AuditEntry.objects.get(id=e.id + 100000) for e in later]
    [checkpoint, *rest] = ledger()

    report = verify_ledger()

    # Everything up to the old head went; the checkpoint that covers it is the first entry left.
    assert (checkpoint.action, checkpoint.sequence) == (PRUNE_ACTION, head.sequence + 1)
    assert checkpoint.data["through_sequence"] == head.sequence and checkpoint.data["through_hash"] == head.hash
    assert checkpoint.prev_hash == head.hash
    assert [e.id for e in rest] == [e.id for e in later]
    assert report == Report(3, head.sequence + 1, head.sequence + 3, rest[-1].hash, None)


def test_a_pruned_prefix_no_checkpoint_covers_is_reported_at_the_first_entry_left():
    entries = record(3)
    ledger()
    kept = AuditEntry.objects.get(id=entries[2].id)
    tamper("DELETE FROM audit_entry WHERE sequence < %s", [kept.sequence])

    report = verify_ledger()

    reason = f"entries 1..{kept.sequence - 1} are missing and no prune checkpoint covers them"
    assert report == Report(0, None, None, None, Break(kept.sequence, kept.id, reason))
    with pytest.raises(CommandError, match=re.escape(
            f"audit ledger: BROKEN at sequence {kept.sequence} (entry id {kept.id}): {reason} "
            "(0 entries verified before it)")):
        call_command("audit_verify")


def test_a_checkpoint_for_another_sequence_does_not_anchor_the_prefix():
    record(3)
    head = ledger()[-1]
    audit_prune(before=past_every_entry(), actor="user:compliance")
    [checkpoint] = ledger()
    tamper("UPDATE audit_entry SET payload = %s WHERE id = %s",
           [canonical_json({**checkpoint.data, "through_sequence": head.sequence - 1}), checkpoint.id])

    report = verify_ledger()

    assert report.broken == Break(checkpoint.sequence, checkpoint.id,
                                  f"entries 1..{head.sequence} are missing and no prune checkpoint covers them")
