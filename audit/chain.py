"""The hash chain: canonical entries, linking, and walking the chain to find the first break.

Owns the formulas, and nothing else may compute them:

    digest = SHA-256(canonical JSON of the entry's recorded fields)      (`CONTENT_FIELDS`)
    hash   = SHA-256(prev_hash + ":" + sequence + ":" + digest)           (hex, ASCII)

The first entry's prev_hash is 64 zeros; every other entry's is the previous entry's hash, and
its sequence the previous sequence + 1. Canonical JSON is sorted keys, no spaces, ASCII.

The ledger is partitioned into shards (AUDIT_LEDGER_SHARDS on PostgreSQL; one on SQLite), each
its own chain with its own sequence, head and lock: an entry's shard is a stable hash of its
run (or, without one, of its subject; the ledger's own entries are shard 0's), so a run's
history is one ordered chain. A ledger written before shards existed is shard 0's chain.

Linking must be linear within a shard, so appends to one shard are serialized:
- SQLite: `link_and_insert` reads the head and inserts in the caller's transaction; Stepwise's
  IMMEDIATE transactions already hold the database's write lock, so no two can interleave.
- PostgreSQL: the row is inserted with the chain fields NULL, and a deferred constraint
  trigger (`audit_entry_seal`, migrations 0001, 0002, 0006 and 0008) takes the advisory lock
  of every shard the transaction wrote to (`CHAIN_LOCK_KEY + shard`, in shard order, so two
  transactions never wait for each other in a cycle; the insert trigger lists those shards in a
  transaction-local setting, so the seal reads no other entries), reads each shard's head and fills the
  chain fields at COMMIT; the transaction's next entries of a shard chain onto the head it
  carries (a transaction-local setting), the lock being theirs already. The locks are
  therefore held only while the transaction commits, never while it still takes row locks,
  so they cannot deadlock with the engine's `SELECT ... FOR UPDATE` on runs and steps; a
  shard's chain order is the commit order of its entries, and commits touching different
  shards do not wait for each other.
  The trigger computes `hash` with the formula above from the digest computed here.

This module must not decide what is recorded (services) or what is hidden (redaction).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from django.conf import settings
from django.db import connection

from orchestrator.engine.hashing import canonical_json, sha256_hex
from orchestrator.engine.txscope import TransactionMemo
from orchestrator.store import build_row, insert_json_rows, insert_rows

from .models import GENESIS_HASH, AuditEntry

# Any constant works; it only has to be the same in the seal trigger (migrations 0001, 0002,
# 0006). Shard s is sealed under CHAIN_LOCK_KEY + s.
CHAIN_LOCK_KEY = 727_001
PRUNE_ACTION = "audit.pruned"

# The fields the digest covers, in no particular order (canonical JSON sorts them).
CONTENT_FIELDS = (
    "created_at", "actor", "actor_kind", "action", "subject_type", "subject_id", "team",
    "workflow", "workflow_version", "definition_digest", "run_id", "step_name", "event_id",
    "proposal_hash", "model", "prompt_version", "idempotency_key", "correlation_id", "outcome",
    "payload", "payload_ref",
)
CHAIN_FIELDS = ("sequence", "prev_hash", "hash", "digest", "shard")
_ROW_FIELDS = (*CONTENT_FIELDS, *CHAIN_FIELDS)


def timestamp_text(value: datetime) -> str:
    """The one textual form of an entry's time (UTC, microseconds)."""
    return value.astimezone(UTC).isoformat(timespec="microseconds")


def entry_row(entry: AuditEntry) -> dict:
    """An entry as plain JSON values: what exports contain and what the digest is computed on."""
    loaded = entry.__dict__  # a field not loaded (deferred) is read through its descriptor
    return _plain({name: loaded[name] if name in loaded else getattr(entry, name) for name in _ROW_FIELDS})


def _plain(row: dict) -> dict:
    """An entry's field values (by attribute name, every field but its id) as JSON values."""
    row["created_at"] = timestamp_text(row["created_at"])
    row["run_id"] = str(row["run_id"]) if row["run_id"] else None
    return row


def content_digest(row: Mapping) -> str:
    return sha256_hex(canonical_json({name: row[name] for name in CONTENT_FIELDS}))


def link_hash(prev_hash: str, sequence: int, digest: str) -> str:
    return sha256_hex(f"{prev_hash}:{sequence}:{digest}")


def seals_in_database() -> bool:
    return connection.vendor == "postgresql"


def ledger_shards() -> int:
    """How many chains new entries are spread over: AUDIT_LEDGER_SHARDS on PostgreSQL; one on
    SQLite, whose single writer serializes every transaction whatever the chains."""
    return max(1, int(settings.AUDIT_LEDGER_SHARDS)) if seals_in_database() else 1


def shard_of(fields: Mapping, shards: int | None = None) -> int:
    """The shard of an entry given by its content fields: a stable hash of its run, else of
    its subject, so all of a run's entries are one chain; the ledger's own entries (prune
    checkpoints, verification and export requests) are shard 0's."""
    shards = ledger_shards() if shards is None else shards
    if shards == 1 or fields.get("subject_type") == "ledger":
        return 0
    run = fields.get("run_id")
    key = f"run:{str(run).lower()}" if run else f"{fields.get('subject_type')}:{fields.get('subject_id')}"
    return int(sha256_hex(key)[:8], 16) % shards


# SQLite: the head this transaction's last append left. The transaction holds the database's
# write lock from its BEGIN IMMEDIATE, so no one else can append before it ends; the memo
# forgets at commit, at rollback and at the rollback of a savepoint taken before the append.
_HEAD = TransactionMemo("audit_head")


def link_and_insert(entry: AuditEntry) -> AuditEntry:
    """Compute the digest and append `entry` (inside the caller's transaction)."""
    return link_and_insert_all([entry])[0]


def link_and_insert_all(entries: list[AuditEntry], *, keys: bool = True) -> list[AuditEntry]:
    """Append `entries` in order, in one INSERT (inside the caller's transaction). `keys=False`:
    the caller reads none of their keys now (`orchestrator.store.held_writes`).

    On SQLite the chain head is read once per transaction, then carried from append to append.
    """
    shards = ledger_shards()
    for entry in entries:
        entry.shard = shard_of({"subject_type": entry.subject_type, "subject_id": entry.subject_id,
                                "run_id": entry.run_id}, shards)
        entry.digest = content_digest(entry_row(entry))
    if seals_in_database():
        insert_rows(entries, keys=keys)  # the seal fills the chain fields at COMMIT
        return entries
    head = _HEAD.get() or chain_head()
    for entry in entries:
        entry.sequence = head[0] + 1 if head else 1
        entry.prev_hash = head[1] if head else GENESIS_HASH
        entry.hash = link_hash(entry.prev_hash, entry.sequence, entry.digest)
        head = (entry.sequence, entry.hash)
    insert_rows(entries, keys=keys)
    _HEAD.set(head)
    return entries


def append_all(entries: list[dict]) -> None:
    """Append entries given by their content fields (`CONTENT_FIELDS`, as `AuditEntry` takes
    them), in order, in one INSERT (inside the caller's transaction); their keys are not read.

    On PostgreSQL with the fast store the rows the digest is computed on are what is sent: no
    model instance is built. Elsewhere `link_and_insert_all` links and inserts their instances.
    """
    if seals_in_database():
        shards = ledger_shards()
        rows = [_plain({**fields, "sequence": None, "prev_hash": None, "hash": None,
                        "shard": shard_of(fields, shards)}) for fields in entries]
        for row in rows:
            row["digest"] = content_digest(row)
        if insert_json_rows(AuditEntry, rows):
            return
    link_and_insert_all([build_row(AuditEntry, **fields) for fields in entries], keys=False)


def chain_head(shard: int = 0) -> tuple[int, str] | None:
    """(sequence, hash) of `shard`'s newest linked entry, or None when that chain is empty."""
    # One fixed statement, read by every audited transaction on SQLite: compiling it through
    # the ORM each time cost several times what the query does.
    with connection.cursor() as cursor:
        cursor.execute(_HEAD_SQL, [shard])
        row = cursor.fetchone()
    return (row[0], row[1]) if row else None


_HEAD_SQL = (f'SELECT "sequence", "hash" FROM "{AuditEntry._meta.db_table}" '
             'WHERE "shard" = %s AND "sequence" IS NOT NULL ORDER BY "sequence" DESC LIMIT 1')


def chain_heads() -> dict[int, tuple[int, str]]:
    """shard -> (sequence, hash) of its newest linked entry, for every shard with one."""
    heads = {}
    for shard in shards_present():
        head = chain_head(shard)
        if head is not None:
            heads[shard] = head
    return heads


def shards_present() -> list[int]:
    """The shards holding at least one entry, in order (one index probe per shard)."""
    found, after = [], -1
    while True:
        shard = (AuditEntry.objects.filter(shard__gt=after).order_by("shard")
                 .values_list("shard", flat=True).first())
        if shard is None:
            return found
        found.append(shard)
        after = shard


def seal_pending() -> None:
    """Chain this transaction's entries now instead of at commit (PostgreSQL; else a no-op).

    For readers inside a transaction that has written entries (verification in tests, prune).
    Sealing takes the chain lock, which is then held until the transaction ends.
    """
    if seals_in_database() and connection.in_atomic_block:
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS audit_entry_seal IMMEDIATE")
            cursor.execute("SET CONSTRAINTS audit_entry_seal DEFERRED")


def chain_lock() -> None:
    """Hold every shard's append lock until the transaction ends, taken in shard order as the
    seal takes them (PostgreSQL; SQLite already holds its one writer lock)."""
    if seals_in_database():
        last = max([ledger_shards() - 1, *shards_present()])
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s + s) FROM generate_series(0, %s) AS s",
                           [CHAIN_LOCK_KEY, last])


# --- verification ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Break:
    sequence: int | None
    entry_id: int | None
    reason: str
    shard: int = 0

    def __str__(self) -> str:
        where = f"sequence {self.sequence}" if self.sequence is not None else "the ledger"
        if self.shard and self.sequence is not None:
            where = f"shard {self.shard} {where}"
        ident = f" (entry id {self.entry_id})" if self.entry_id is not None else ""
        return f"{where}{ident}: {self.reason}"


@dataclass(frozen=True)
class Report:
    count: int
    first_sequence: int | None
    head_sequence: int | None
    head_hash: str | None
    broken: Break | None = None
    # shard -> (sequence, hash) of every shard's head walked; the fields above are shard 0's.
    heads: dict = field(default_factory=dict, compare=False)

    @property
    def ok(self) -> bool:
        return self.broken is None


def verify_rows(rows: Iterable[Mapping], *, anchor: str, start: int) -> Report:
    """Walk `rows` (entry rows in sequence order) from `start`, whose prev_hash must be `anchor`.

    Stops at the first broken link and says why. Works on database rows and on exports alike.
    """
    expected_prev, expected_seq = anchor, start
    count, first, last_hash = 0, None, None
    for row in rows:
        sequence, ident = row.get("sequence"), row.get("id")
        reason = None
        if sequence != expected_seq:
            reason = (f"expected sequence {expected_seq}: entries are missing"
                      if isinstance(sequence, int) and sequence > expected_seq
                      else f"expected sequence {expected_seq}, found {sequence}")
        elif row.get("prev_hash") != expected_prev:
            reason = "prev_hash does not match the previous entry's hash (an entry was removed or replaced)"
        elif content_digest(row) != row.get("digest"):
            reason = "the entry's content does not match its digest (it was edited)"
        elif link_hash(row["prev_hash"], sequence, row["digest"]) != row.get("hash"):
            reason = "the entry's hash does not match prev_hash, sequence and digest"
        if reason:
            return Report(count, first, expected_seq - 1 if count else None, last_hash,
                          Break(sequence if isinstance(sequence, int) else expected_seq, ident, reason))
        count += 1
        first = sequence if first is None else first
        expected_prev, expected_seq, last_hash = row["hash"], sequence + 1, row["hash"]
    return Report(count, first, expected_seq - 1 if count else None, last_hash)


def prune_anchors() -> dict[int, dict[int, str]]:
    """shard -> {through_sequence: through_hash}: where the prune checkpoints in the ledger left
    each shard's chain (shard 0's at the payload's top level, the others' under "shards")."""
    found: dict[int, dict[int, str]] = {}
    for text in AuditEntry.objects.filter(action=PRUNE_ACTION).values_list("payload", flat=True):
        data = json.loads(text)
        parts = {**({"0": data} if "through_sequence" in data else {}), **data.get("shards", {})}
        for shard, part in parts.items():
            found.setdefault(int(shard), {})[int(part["through_sequence"])] = part["through_hash"]
    return found


def first_sequence(shard: int) -> int | None:
    """The sequence of `shard`'s oldest linked entry (after a prune, the first it kept)."""
    return (AuditEntry.objects.filter(shard=shard, sequence__isnull=False).order_by("sequence")
            .values_list("sequence", flat=True).first())


def verify_ledger(*, progress: Callable[[int], None] | None = None) -> Report:
    """Walk every shard's chain in the database. A shard's pruned prefix is anchored by the prune
    checkpoint that records where it ends; an unpruned chain starts at the genesis hash.

    `progress(count)` is called with the number of entries read, every `PROGRESS_EVERY`.
    The report's count is every shard's; its sequences and head are shard 0's, and `heads`
    holds each shard's.
    """
    seal_pending()
    unsealed = AuditEntry.objects.filter(sequence__isnull=True).values_list("id", flat=True).first()
    if unsealed is not None:
        return Report(0, None, None, None, Break(None, unsealed, "entry was never linked into the chain"))
    total, heads, zero = 0, {}, Report(0, None, None, None)
    anchors = prune_anchors()
    for shard in shards_present():
        counted = _offset(progress, total)
        report = _verify_shard(shard, anchors.get(shard, {}), counted)
        total += report.count
        if report.head_sequence is not None:
            heads[shard] = (report.head_sequence, report.head_hash)
        if shard == 0:
            zero = report
        if report.broken is not None:
            return replace(zero if shard == 0 else Report(0, None, None, None, report.broken),
                           count=total, heads=heads)
    return replace(zero, count=total, heads=heads)


def _offset(progress: Callable[[int], None] | None, before: int) -> Callable[[int], None] | None:
    return None if progress is None else (lambda count: progress(before + count))


def _verify_shard(shard: int, anchors: Mapping[int, str],
                  progress: Callable[[int], None] | None) -> Report:
    """`shard`'s chain, from its first entry: 1, or one after a prune anchor in `anchors`
    (through_sequence -> through_hash)."""
    sealed = AuditEntry.objects.filter(shard=shard, sequence__isnull=False)
    first = first_sequence(shard)
    if first is None:
        return Report(0, None, None, None)
    if first == 1:
        anchor = GENESIS_HASH
    else:
        anchor = anchors.get(first - 1)
        if anchor is None:
            entry_id = sealed.values_list("id", flat=True).get(sequence=first)
            return Report(0, None, None, None, Break(
                first, entry_id, f"entries 1..{first - 1} are missing and no prune checkpoint covers them",
                shard))
    report = verify_rows(_rows(progress, shard=shard), anchor=anchor, start=first)
    if report.broken is not None and shard:
        report = replace(report, broken=replace(report.broken, shard=shard))
    return report


PROGRESS_EVERY = 2000


def _rows(progress: Callable[[int], None] | None = None, *, after: int | None = None,
          shard: int = 0) -> Iterator[dict]:
    # Read in pages by sequence rather than through one open cursor, so that a caller may
    # write (its progress) on the same connection between two pages.
    sealed = AuditEntry.objects.filter(shard=shard, sequence__isnull=False).order_by("sequence")
    count, last = 0, after
    while True:
        page = list((sealed if last is None else sealed.filter(sequence__gt=last))[:PROGRESS_EVERY])
        for entry in page:
            yield {"id": entry.id, **entry_row(entry)}
        count += len(page)
        if len(page) < PROGRESS_EVERY:
            return
        last = page[-1].sequence
        if progress is not None:
            progress(count)


def verify_ledger_after(*, sequence: int, hash: str, heads: Mapping[int, tuple[int, str]] | None = None,
                        progress: Callable[[int], None] | None = None) -> Report:
    """Walk only the entries after `sequence` in shard 0, whose entry must have `hash` (a link
    already known intact: an incremental verification starts from one), and in every other
    shard those after its head in `heads` (the whole chain of a shard not in it, or pruned
    past it). The report
    counts the entries walked; its head is shard 0's entry at `sequence` when there are none.
    """
    seal_pending()
    unsealed = AuditEntry.objects.filter(sequence__isnull=True).values_list("id", flat=True).first()
    if unsealed is not None:
        return Report(0, None, None, None, Break(None, unsealed, "entry was never linked into the chain"))
    known = {**(heads or {}), 0: (sequence, hash)}
    anchors = prune_anchors()
    total, found_heads, zero = 0, {}, Report(0, None, None, None)
    for shard in sorted({0, *shards_present()}):
        counted = _offset(progress, total)
        # A shard pruned past its known head since is walked from where the prune left it.
        report = (_verify_shard_after(shard, *known[shard], counted)
                  if shard in known and known[shard][0] > max(anchors.get(shard, {0: ""}))
                  else _verify_shard(shard, anchors.get(shard, {}), counted))
        total += report.count
        if report.head_sequence is not None:
            found_heads[shard] = (report.head_sequence, report.head_hash)
        if shard == 0:
            zero = report
        if report.broken is not None:
            return replace(zero if shard == 0 else Report(0, None, None, None, report.broken),
                           count=total, heads=found_heads)
    return replace(zero, count=total, heads=found_heads)


def _verify_shard_after(shard: int, sequence: int, hash: str,
                        progress: Callable[[int], None] | None) -> Report:
    found = AuditEntry.objects.filter(shard=shard, sequence=sequence).values_list("id", "hash").first()
    if found is None or found[1] != hash:
        return Report(0, None, None, None, Break(
            sequence, found[0] if found else None,
            "the entry an earlier verification found intact is missing" if found is None
            else "the entry an earlier verification found intact has another hash now", shard))
    report = verify_rows(_rows(progress, after=sequence, shard=shard), anchor=hash, start=sequence + 1)
    if report.broken is not None and shard:
        report = replace(report, broken=replace(report.broken, shard=shard))
    if report.count == 0 and report.broken is None:
        return Report(0, None, sequence, hash)
    return report
