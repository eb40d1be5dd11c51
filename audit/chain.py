"""The hash chain: canonical entries, linking, and walking the chain to find the first break.

Owns the formulas, and nothing else may compute them:

    digest = SHA-256(canonical JSON of the entry's recorded fields)      (`CONTENT_FIELDS`)
    hash   = SHA-256(prev_hash + ":" + sequence + ":" + digest)           (hex, ASCII)

The first entry's prev_hash is 64 zeros; every other entry's is the previous entry's hash, and
its sequence the previous sequence + 1. Canonical JSON is sorted keys, no spaces, ASCII.

Linking must be linear, so appends are serialized:
- SQLite: `link_and_insert` reads the head and inserts in the caller's transaction; Stepwise's
  IMMEDIATE transactions already hold the database's write lock, so no two can interleave.
- PostgreSQL: the row is inserted with the chain fields NULL, and a deferred constraint
  trigger (`audit_entry_seal`, migrations 0001 and 0002) takes
  `pg_advisory_xact_lock(CHAIN_LOCK_KEY)`, reads the head and fills them at COMMIT; the
  transaction's next entries chain onto the head it carries (a transaction-local setting),
  the lock being theirs already. The lock is therefore held only while the transaction
  commits, never while it still takes row locks, so it cannot deadlock with the engine's
  `SELECT ... FOR UPDATE` on runs and steps; the chain order is the commit order.
  The trigger computes `hash` with the formula above from the digest computed here.

This module must not decide what is recorded (services) or what is hidden (redaction).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import connection

from orchestrator.engine.hashing import canonical_json, sha256_hex
from orchestrator.engine.txscope import TransactionMemo
from orchestrator.store import build_row, insert_json_rows, insert_rows

from .models import GENESIS_HASH, AuditEntry

# Any constant works; it only has to be the same in the seal trigger (migrations 0001, 0002).
CHAIN_LOCK_KEY = 727_001
PRUNE_ACTION = "audit.pruned"

# The fields the digest covers, in no particular order (canonical JSON sorts them).
CONTENT_FIELDS = (
    "created_at", "actor", "actor_kind", "action", "subject_type", "subject_id", "team",
    "workflow", "workflow_version", "definition_digest", "run_id", "step_name", "event_id",
    "proposal_hash", "model", "prompt_version", "idempotency_key", "correlation_id", "outcome",
    "payload", "payload_ref",
)
CHAIN_FIELDS = ("sequence", "prev_hash", "hash", "digest")
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
    for entry in entries:
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
        rows = [_plain({**fields, "sequence": None, "prev_hash": None, "hash": None}) for fields in entries]
        for row in rows:
            row["digest"] = content_digest(row)
        if insert_json_rows(AuditEntry, rows):
            return
    link_and_insert_all([build_row(AuditEntry, **fields) for fields in entries], keys=False)


def chain_head() -> tuple[int, str] | None:
    """(sequence, hash) of the newest linked entry, or None when the ledger is empty."""
    # One fixed statement, read by every audited transaction on SQLite: compiling it through
    # the ORM each time cost several times what the query does.
    with connection.cursor() as cursor:
        cursor.execute(_HEAD_SQL)
        row = cursor.fetchone()
    return (row[0], row[1]) if row else None


_HEAD_SQL = (f'SELECT "sequence", "hash" FROM "{AuditEntry._meta.db_table}" '
             'WHERE "sequence" IS NOT NULL ORDER BY "sequence" DESC LIMIT 1')


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
    """Hold the append lock until the transaction ends (PostgreSQL; SQLite already holds it)."""
    if seals_in_database():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [CHAIN_LOCK_KEY])


# --- verification ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Break:
    sequence: int | None
    entry_id: int | None
    reason: str

    def __str__(self) -> str:
        where = f"sequence {self.sequence}" if self.sequence is not None else "the ledger"
        ident = f" (entry id {self.entry_id})" if self.entry_id is not None else ""
        return f"{where}{ident}: {self.reason}"


@dataclass(frozen=True)
class Report:
    count: int
    first_sequence: int | None
    head_sequence: int | None
    head_hash: str | None
    broken: Break | None = None

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


def checkpoints() -> dict[int, str]:
    """through_sequence -> through_hash, from every prune checkpoint in the ledger."""
    found = {}
    for text in AuditEntry.objects.filter(action=PRUNE_ACTION).values_list("payload", flat=True):
        data = json.loads(text)
        found[int(data["through_sequence"])] = data["through_hash"]
    return found


def verify_ledger(*, progress: Callable[[int], None] | None = None) -> Report:
    """Walk the whole ledger in the database. A pruned prefix is anchored by its checkpoint.

    `progress(count)` is called with the number of entries read, every `PROGRESS_EVERY`.
    """
    seal_pending()
    unsealed = AuditEntry.objects.filter(sequence__isnull=True).values_list("id", flat=True).first()
    if unsealed is not None:
        return Report(0, None, None, None, Break(None, unsealed, "entry was never linked into the chain"))
    first = (AuditEntry.objects.filter(sequence__isnull=False).order_by("sequence")
             .values_list("sequence", flat=True).first())
    if first is None:
        return Report(0, None, None, None)
    if first == 1:
        anchor = GENESIS_HASH
    else:
        anchor = checkpoints().get(first - 1)
        if anchor is None:
            entry_id = AuditEntry.objects.values_list("id", flat=True).get(sequence=first)
            return Report(0, None, None, None, Break(
                first, entry_id, f"entries 1..{first - 1} are missing and no prune checkpoint covers them"))
    return verify_rows(_rows(progress), anchor=anchor, start=first)


PROGRESS_EVERY = 2000


def _rows(progress: Callable[[int], None] | None = None) -> Iterator[dict]:
    # Read in pages by sequence rather than through one open cursor, so that a caller may
    # write (its progress) on the same connection between two pages.
    sealed = AuditEntry.objects.filter(sequence__isnull=False).order_by("sequence")
    count, last = 0, None
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
