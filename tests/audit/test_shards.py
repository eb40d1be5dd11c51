"""The ledger partitioned into shards (audit migrations 0006, 0008): each shard is its own chain sealed
under its own lock, so commits of different shards do not wait for each other while one shard
still links linearly; verification walks every shard, and a signed checkpoint covers every
shard's head through a Merkle root."""
import json
import threading
import uuid
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, connections, transaction

from audit import anchoring
from audit.chain import (
    GENESIS_HASH,
    chain_heads,
    ledger_shards,
    link_hash,
    seal_pending,
    shard_of,
    verify_ledger,
)
from audit.models import AuditEntry
from audit.services import audit_record
from audit.signing import trusted_keys
from audit.verification import ledger_check
from orchestrator.engine import clock

from .conftest import tamper
from .test_anchoring import rewrite_and_rechain

SHARDS = 16
postgresql_only = pytest.mark.skipif("connection.vendor != 'postgresql'",
                                     reason="SQLite keeps one shard: its writer lock serializes every commit")


def subject_in(shard: int, shards: int = SHARDS, avoid: tuple = ()) -> str:
    """A run subject id whose entries fall in `shard`."""
    for n in range(10_000):
        subject = f"shard-test-{n}"
        if subject not in avoid and shard_of({"subject_type": "run", "subject_id": subject}, shards) == shard:
            return subject
    raise AssertionError(f"no subject found for shard {shard}")


def record(subject: str, n: int = 0) -> AuditEntry:
    return audit_record(action="test.event", actor="service:test", subject_type="run",
                        subject_id=subject, payload={"n": n})


def chain_of(shard: int) -> list[AuditEntry]:
    seal_pending()
    return list(AuditEntry.objects.filter(shard=shard).order_by("sequence"))


def assert_linked(entries: list[AuditEntry]) -> None:
    for before, after in zip(entries, entries[1:], strict=False):
        assert (after.sequence, after.prev_hash) == (before.sequence + 1, before.hash)
        assert after.hash == link_hash(after.prev_hash, after.sequence, after.digest)


@pytest.fixture
def sharded(settings):
    settings.AUDIT_LEDGER_SHARDS = SHARDS
    return SHARDS


@pytest.fixture
def committed_shards_removed():
    """Entries committed by a test that cannot run in a transaction rolled back: removed from
    shards 1.. afterwards (around the guard, as `tamper` does), so later tests find the ledger
    they would have found (shard 0 is not written by these tests)."""
    yield
    with transaction.atomic():
        tamper("DELETE FROM audit_entry WHERE shard > 0")


# --- which shard ---------------------------------------------------------------------------------


def test_a_runs_entries_share_one_shard_and_the_ledgers_own_entries_are_shard_zeros():
    run = uuid.uuid4()
    shards = {shard_of({"subject_type": kind, "subject_id": n, "run_id": run}, SHARDS)
              for kind, n in (("run", run), ("step", "draft"), ("approval", 7))}
    assert len(shards) == 1
    assert shard_of({"subject_type": "run", "subject_id": "x", "run_id": str(run).upper()}, SHARDS) in shards
    assert shard_of({"subject_type": "ledger", "subject_id": "audit_entry"}, SHARDS) == 0
    spread = {shard_of({"subject_type": "run", "subject_id": str(n)}, SHARDS) for n in range(400)}
    assert spread == set(range(SHARDS))
    assert {shard_of({"subject_type": "run", "subject_id": str(n)}, 1) for n in range(50)} == {0}


@pytest.mark.django_db
def test_sqlite_keeps_one_shard(sharded):
    if connection.vendor != "sqlite":
        pytest.skip("SQLite only")
    assert ledger_shards() == 1
    entry = record(subject_in(5))
    assert entry.shard == 0 and verify_ledger().ok


# --- the Merkle root ------------------------------------------------------------------------------


def test_the_merkle_root_changes_with_any_head_and_does_not_depend_on_their_order():
    heads = [(0, 10, "a" * 64), (3, 4, "b" * 64), (9, 1, "c" * 64)]
    root = anchoring.merkle_root(heads)
    assert anchoring.merkle_root(list(reversed(heads))) == root
    for i in range(len(heads)):
        for changed in ((heads[i][0], heads[i][1] + 1, heads[i][2]), (heads[i][0], heads[i][1], "d" * 64)):
            assert anchoring.merkle_root([*heads[:i], changed, *heads[i + 1:]]) != root
    assert anchoring.merkle_root(heads[:2]) != root
    assert anchoring.merkle_root([]) == GENESIS_HASH


# --- PostgreSQL: chains, verification, checkpoints -------------------------------------------------


@postgresql_only
@pytest.mark.django_db
def test_entries_of_different_shards_form_separate_chains_and_verify(sharded):
    a, b = subject_in(3), subject_in(11)
    for n in range(3):
        record(a, n)
        record(b, n)
    three, eleven = chain_of(3), chain_of(11)
    assert [e.sequence for e in three] == [1, 2, 3] == [e.sequence for e in eleven]
    assert three[0].prev_hash == GENESIS_HASH == eleven[0].prev_hash
    assert_linked(three)
    assert_linked(eleven)
    report = verify_ledger()
    assert report.ok
    assert report.heads[3] == (3, three[-1].hash) and report.heads[11] == (3, eleven[-1].hash)


@postgresql_only
@pytest.mark.django_db
@pytest.mark.parametrize("how", ["edited", "removed"])
def test_a_tampered_entry_in_any_shard_is_found(sharded, how):
    a, b = subject_in(2), subject_in(14)
    for n in range(4):
        record(a, n)
        record(b, n)
    victim = chain_of(14)[1]
    if how == "edited":
        tamper("UPDATE audit_entry SET payload = %s WHERE id = %s", ['{"n":99}', victim.id])
    else:
        tamper("DELETE FROM audit_entry WHERE id = %s", [victim.id])

    report = verify_ledger()

    assert not report.ok and report.broken.shard == 14
    if how == "edited":
        assert report.broken.entry_id == victim.id
        assert str(report.broken).startswith(f"shard 14 sequence {victim.sequence} (entry id {victim.id})")
    else:
        assert "entries are missing" in str(report.broken)
    check = ledger_check(allow_missing_checkpoint=True)
    assert not check.ok and "BROKEN at shard 14" in check.message


@postgresql_only
@pytest.mark.django_db
def test_a_checkpoint_signs_every_shards_head_through_its_root(sharded):
    a, b = subject_in(4), subject_in(9)
    record(a)
    record(b)
    first = anchoring.checkpoint_write(reason="test")
    assert first.problem(trusted_keys()) is None
    heads = chain_heads()
    assert first.heads == heads and len(heads) >= 2
    assert first.root == anchoring.merkle_root([(s, *h) for s, h in heads.items()])

    record(b, 1)  # only shard 9's head moves
    second = anchoring.checkpoint_write(reason="test")
    assert second.heads[4] == first.heads[4] and second.heads[9] != first.heads[9]
    assert second.root != first.root

    # A head altered in the file no longer gives the signed root; a root recomputed for it no
    # longer matches the signature.
    document = first.document()
    document["shards"] = [[s, q + 1 if s == 9 else q, h] for s, q, h in document["shards"]]
    altered = anchoring.Checkpoint.from_document(document)
    assert "do not give its signed Merkle root" in altered.problem(trusted_keys())
    document["root"] = anchoring.merkle_root([tuple(head) for head in document["shards"]])
    assert "signature does not verify" in anchoring.Checkpoint.from_document(document).problem(trusted_keys())


@postgresql_only
@pytest.mark.django_db
def test_a_truncated_or_rewritten_shard_no_longer_matches_the_checkpoint(sharded):
    a, b = subject_in(5), subject_in(12)
    for n in range(3):
        record(a, n)
        record(b, n)
    anchoring.checkpoint_write(reason="test")
    assert ledger_check().ok
    head = chain_of(12)[-1]

    # The tail of shard 12 deleted: its chain is intact, the checkpoint's head is gone.
    tamper("DELETE FROM audit_entry WHERE id = %s", [head.id])
    assert verify_ledger().ok
    check = ledger_check()
    assert not check.ok
    assert f"shard 12's tail was truncated: its chain ends at sequence {head.sequence - 1}" in check.message

    # Shard 5 rewritten from its second entry on, digests and links recomputed: intact, but
    # not what the checkpoint signed.
    tamper("DELETE FROM audit_entry WHERE shard = 12")
    rewrite_and_rechain(chain_of(5)[1], payload='{"n":99}')
    assert verify_ledger().ok
    check = ledger_check()
    assert not check.ok and "history was rewritten in shard 5: the entry at sequence 3" in check.message


@postgresql_only
@pytest.mark.django_db
def test_an_incremental_verification_walks_each_shard_after_the_checkpoint(sharded, auditor):
    from audit.verification import ledger_verification_request, ledger_verification_run
    a, b = subject_in(6), subject_in(13)
    for n in range(3):
        record(a, n)
        record(b, n)
    anchoring.checkpoint_write(reason="test")
    full = ledger_verification_run(verification_id=ledger_verification_request(actor=auditor).pk)
    assert full.state == "passed" and full.through_heads["13"][0] == 3
    anchoring.checkpoint_write(reason="test")
    record(b, 3)
    record(b, 4)

    check = ledger_check(incremental=True)

    assert check.ok and check.mode == "incremental", check.message
    assert check.report.heads[13] == (5, chain_of(13)[-1].hash)
    assert check.report.heads[6] == (3, chain_of(6)[-1].hash)
    incremental = ledger_verification_run(
        verification_id=ledger_verification_request(actor=auditor, incremental=True).pk)
    assert incremental.state == "passed" and incremental.mode == "incremental", incremental.result
    # The two new entries of shard 13 and the request's own in shard 0.
    assert incremental.entries_total == incremental.entries_checked == 3

    tamper("UPDATE audit_entry SET payload = %s WHERE shard = 13 AND sequence = 5", ['{"n":99}'])
    check = ledger_check(incremental=True)
    assert not check.ok and "BROKEN at shard 13 sequence 5" in check.message


@postgresql_only
@pytest.mark.django_db
def test_audit_verify_checks_every_shard(sharded, capsys):
    a = subject_in(8)
    record(a)
    record(a, 1)
    call_command("audit_checkpoint")
    call_command("audit_verify")
    assert "OK" in capsys.readouterr().out
    tamper("UPDATE audit_entry SET payload = %s WHERE shard = 8 AND sequence = 2", ['{"n":7}'])
    with pytest.raises(CommandError, match="BROKEN at shard 8 sequence 2"):
        call_command("audit_verify")


# --- PostgreSQL: concurrent commits ---------------------------------------------------------------


class Writer(threading.Thread):
    """A transaction on a connection of its own that records entries of `subjects`, seals them
    (taking their shards' locks, held until it ends) and waits for `release` before committing;
    `lock_timeout` bounds how long it may wait for a lock."""

    def __init__(self, subjects: list[str], *, release: threading.Event | None = None,
                 lock_timeout: str = "20s", hold: bool = False):
        super().__init__(daemon=True)
        self.subjects, self.release, self.lock_timeout, self.hold = subjects, release, lock_timeout, hold
        self.sealed, self.error, self.ids = threading.Event(), None, []

    def run(self):
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute(f"SET LOCAL lock_timeout = '{self.lock_timeout}'")
                self.ids = [record(subject, n).id for n, subject in enumerate(self.subjects)]
                if self.hold:
                    seal_pending()  # its shards' locks are now held until it ends
                self.sealed.set()
                if self.release is not None:
                    assert self.release.wait(30)
        except DatabaseError as exc:
            self.error = exc
        finally:
            self.sealed.set()
            connections.close_all()


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_commits_of_different_shards_do_not_wait_for_each_other(sharded, committed_shards_removed):
    held = subject_in(3)
    release = threading.Event()
    holder = Writer([held], release=release, hold=True)
    holder.start()
    assert holder.sealed.wait(30) and holder.error is None
    try:
        # Another shard commits while shard 3's lock is held (a wait would hit lock_timeout).
        other = Writer([subject_in(7)], lock_timeout="2s")
        other.start()
        other.join(30)
        assert other.error is None and not other.is_alive()
        # The same shard still waits for it.
        same = Writer([subject_in(3, avoid=(held,))], lock_timeout="300ms")
        same.start()
        same.join(30)
        assert "lock timeout" in str(same.error)
    finally:
        release.set()
        holder.join(30)
    assert holder.error is None
    assert verify_ledger().ok
    assert [e.id for e in chain_of(7)] == other.ids


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_concurrent_commits_link_each_shard_linearly_and_never_deadlock(sharded, committed_shards_removed):
    one, two, three = subject_in(1), subject_in(2), subject_in(5)
    # Transactions writing shards in opposite orders, and many on one shard, all at once.
    plans = [[one, two], [two, one], [three], [three], [two, three, one], [one], [three, two]] * 4
    writers = [Writer(plan) for plan in plans]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(60)
    assert [w.error for w in writers] == [None] * len(writers)
    for shard, subject in ((1, one), (2, two), (5, three)):
        entries = chain_of(shard)
        assert len(entries) == sum(plan.count(subject) for plan in plans)
        assert [e.sequence for e in entries] == list(range(1, len(entries) + 1))
        assert entries[0].prev_hash == GENESIS_HASH
        assert_linked(entries)
    assert verify_ledger().ok


@postgresql_only
@pytest.mark.django_db
def test_a_transaction_names_the_shards_it_writes_so_its_seal_scans_no_other_entries(sharded):
    # The seal locks the shards listed here; before (0006) it found them by scanning the
    # unsealed entries through an index that kept every entry sealed since the last vacuum.
    for shard in (5, 2, 5, 9):
        record(subject_in(shard), shard)
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('stepwise.audit_shards', true), txid_current()")
        written, txid = cursor.fetchone()
        cursor.execute("SELECT count(*) FROM pg_indexes WHERE indexname = 'audit_entry_unsealed'")
        unsealed_index = cursor.fetchone()[0]
    assert written == f"{txid}:|5|2|9|"
    assert unsealed_index == 0
    assert [len(chain_of(shard)) for shard in (2, 5, 9)] == [1, 2, 1]
    assert verify_ledger().ok


@postgresql_only
@pytest.mark.django_db
def test_an_export_covers_each_shards_range_and_verifies(sharded, tmp_path):
    from audit.export import export_range, verify_export
    a, b = subject_in(2), subject_in(10)
    for n in range(3):
        record(a, n)
        record(b, n)
    seal_pending()
    start = clock.now() - timedelta(days=1)
    result = export_range(start=start, end=clock.now() + timedelta(days=1), fmt="jsonl",
                          path=tmp_path / "ledger.jsonl")
    shards = result.manifest["shards"]
    assert shards["10"]["first_sequence"] == 1 and shards["10"]["last_sequence"] == 3
    assert shards["10"]["export_head_hash"] == chain_of(10)[-1].hash
    report, problems = verify_export(result.path)
    assert report.ok and problems == []

    rows = [json.loads(line) for line in result.path.read_text().splitlines()]
    victim = next(r for r in rows if r["shard"] == 10 and r["sequence"] == 2)
    victim["payload"] = '{"n":42}'
    result.path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report, problems = verify_export(result.path)
    assert not report.ok and report.broken.shard == 10
