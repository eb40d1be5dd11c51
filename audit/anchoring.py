"""Anchoring: signed checkpoints of the chain head, kept out of the database, and the check
of the ledger against them.

Why: the hash chain (`audit.chain`) shows that entries were changed only to someone who
cannot rewrite it. Whoever can write to the database can drop the triggers, edit an entry,
recompute every digest and hash after it and restore the triggers, or delete the newest
entries: either way the chain is consistent again and `verify_ledger` passes. A checkpoint
records the head — sequence, hash, time — signed with an Ed25519 key the database does not
hold (`audit.signing`), in a checkpoint store outside the database (`audit.stores`: a
directory or an S3 bucket with object lock). Each hash covers every entry before it, so one
checkpoint vouches for the whole chain up to its sequence: a rewritten history no longer
reaches the signed hash, and a truncated tail no longer reaches the signed sequence.

- `checkpoint_write(reason=...)` signs the current head, writes it to the store and notes it
  in the database (`CheckpointRecord`); `checkpoint_if_due()` does so when one is due: at
  start (when the head moved since the last one), then every AUDIT_CHECKPOINT_INTERVAL_S or
  every AUDIT_CHECKPOINT_ENTRIES entries, whichever comes first (`audit.tasks.checkpoint`,
  polled by beat); `audit_export` writes one for its manifest; `manage.py audit_checkpoint`.
- `checkpoints_read()` reads the store and checks every signature.
- `ledger_anchor_check(report)` compares a chain that `chain.verify_ledger` walked with them,
  and says which checkpoint is expected and missing: one the database notes as written that
  the store no longer holds, or entries older than the interval allows that none covers.

A checkpoint file (`checkpoint-<sequence>-<time>-<random>.json`):

    {"format": "stepwise-audit-checkpoint/1", "sequence": 1234, "hash": "<64 hex>",
     "created_at": "2026-01-31T12:00:00.000000+00:00", "reason": "schedule",
     "key_id": "ed25519:<16 hex>", "signature": "<base64>"}

The signature is Ed25519 over the canonical JSON of the first five fields.

When the ledger holds entries in more than shard 0 (`audit.chain`: a chain per shard), the
checkpoint covers every shard's head: `sequence` and `hash` are shard 0's head (0 and the
genesis hash while shard 0 is empty), and two fields are added:

    "shards": [[0, 1234, "<64 hex>"], [3, 87, "<64 hex>"], ...],   (shard, sequence, hash)
    "root": "<64 hex>"

`root` is the Merkle root over the heads in shard order (`merkle_root`), and the signature
covers the first five fields and `root`: a head changed in the file no longer gives the
root, a root changed no longer matches the signature.

This module reads the ledger, writes checkpoint files and their records; it must not change
the ledger.
"""
from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings

from orchestrator.engine.clock import now

from . import chain, signing
from .models import AuditEntry, CheckpointRecord
from .stores import CheckpointStore, checkpoint_store

FORMAT = "stepwise-audit-checkpoint/1"
SIGNED_FIELDS = ("format", "sequence", "hash", "created_at", "reason")
FIELDS = (*SIGNED_FIELDS, "key_id", "signature")


def merkle_root(heads: list[tuple[int, int, str]] | tuple) -> str:
    """The Merkle root over (shard, sequence, hash) heads, taken in shard order: each leaf is
    SHA-256 of `shard:sequence:hash`, each node SHA-256 of its two children's hex joined by
    ":", an odd node out is carried up as it is."""
    level = [chain.sha256_hex(f"{shard}:{sequence}:{hash}") for shard, sequence, hash in sorted(heads)]
    if not level:
        return chain.GENESIS_HASH
    while len(level) > 1:
        pairs = [chain.sha256_hex(f"{level[i]}:{level[i + 1]}") for i in range(0, len(level) - 1, 2)]
        level = pairs + ([level[-1]] if len(level) % 2 else [])
    return level[0]


@dataclass(frozen=True)
class Checkpoint:
    sequence: int
    hash: str
    created_at: str
    reason: str
    key_id: str
    signature: str
    file: str | None = None  # its name in the checkpoint store
    # (shard, sequence, hash) of every shard's head, and their Merkle root; empty when the
    # ledger had entries in shard 0 only.
    shards: tuple = ()
    root: str = ""

    @staticmethod
    def signed_text(sequence: int, hash: str, created_at: str, reason: str, root: str = "") -> bytes:
        signed = {"format": FORMAT, "sequence": sequence, "hash": hash, "created_at": created_at,
                  "reason": reason}
        return chain.canonical_json({**signed, "root": root} if root else signed).encode()

    def document(self) -> dict:
        sharded = {"shards": [list(head) for head in self.shards], "root": self.root} if self.root else {}
        return {"format": FORMAT, "sequence": self.sequence, "hash": self.hash,
                "created_at": self.created_at, "reason": self.reason, **sharded,
                "key_id": self.key_id, "signature": self.signature}

    @property
    def heads(self) -> dict[int, tuple[int, str]]:
        """shard -> (sequence, hash) of every head it signed."""
        if self.shards:
            return {shard: (sequence, hash) for shard, sequence, hash in self.shards}
        return {0: (self.sequence, self.hash)}

    @classmethod
    def from_document(cls, document: object, file: str | None = None) -> Checkpoint:
        """Raises ValueError when `document` is not a checkpoint of this format."""
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} document")
        missing = [name for name in FIELDS if name not in document]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        if not isinstance(document["sequence"], int) or isinstance(document["sequence"], bool):
            raise ValueError("sequence is not an integer")
        shards = document.get("shards") or []
        if not isinstance(shards, list) or not all(
                isinstance(head, list) and len(head) == 3 and all(isinstance(n, int) and not isinstance(n, bool)
                                                                  for n in head[:2]) for head in shards):
            raise ValueError("shards is not a list of [shard, sequence, hash]")
        return cls(document["sequence"], str(document["hash"]), str(document["created_at"]),
                   str(document["reason"]), str(document["key_id"]), str(document["signature"]),
                   file, tuple((shard, sequence, str(hash)) for shard, sequence, hash in shards),
                   str(document.get("root") or ""))

    @property
    def name(self) -> str:
        return self.file or f"checkpoint at sequence {self.sequence}"

    def describe(self) -> str:
        return f"checkpoint {self.name} (signed {self.created_at} by {self.key_id})"

    def problem(self, keys: dict) -> str | None:
        """Why this checkpoint cannot be trusted with `keys` (signing.trusted_keys()), or None."""
        key = keys.get(self.key_id)
        if key is None:
            return (f"{self.name} is signed by {self.key_id}, which is not a trusted key (after a "
                    "rotation, list the old public key in AUDIT_VERIFY_KEYS)")
        message = self.signed_text(self.sequence, self.hash, self.created_at, self.reason, self.root)
        if not signing.signature_valid(key, message, self.signature):
            return f"{self.name}: the signature does not verify (the file was changed or forged)"
        if self.root or self.shards:
            if merkle_root(self.shards) != self.root:
                return (f"{self.name}: its shard heads do not give its signed Merkle root (a head "
                        "was changed in the file)")
            if self.heads.get(0, (0, chain.GENESIS_HASH)) != (self.sequence, self.hash):
                return f"{self.name}: its shard 0 head is not its sequence and hash"
        return None


def checkpoint_write(*, reason: str, store: CheckpointStore | None = None) -> Checkpoint | None:
    """Sign the ledger's current head, write it to the checkpoint store, record it; return it.

    Returns None when the ledger is empty. Raises ImproperlyConfigured when no signing key is
    configured, and the store's own errors (OSError, botocore's) when it cannot be written.
    """
    chain.seal_pending()
    heads = chain.chain_heads()
    if not heads:
        return None
    head = heads.get(0, (0, chain.GENESIS_HASH))
    shards = tuple((shard, *heads[shard]) for shard in sorted(heads)) if set(heads) != {0} else ()
    root = merkle_root(shards) if shards else ""
    store = store or checkpoint_store()
    created = now()
    created_at = chain.timestamp_text(created)
    key_id, signature = signing.sign(Checkpoint.signed_text(head[0], head[1], created_at, reason, root))
    # The zero-padded sequence first, so the last name is the newest head; the random part
    # keeps two processes checkpointing the same head at once from writing one name.
    name = f"checkpoint-{head[0]:012d}-{created:%Y%m%dT%H%M%S%fZ}-{secrets.token_hex(3)}.json"
    checkpoint = Checkpoint(head[0], head[1], created_at, reason, key_id, signature, name, shards, root)
    store.write(name, (json.dumps(checkpoint.document(), indent=2) + "\n").encode())
    # Noted after the file is stored: a note always names a file that was written.
    CheckpointRecord.objects.create(name=name, sequence=head[0], hash=head[1], created_at=created,
                                    reason=reason[:32], key_id=key_id, store=store.describe()[:255],
                                    heads={str(s): [q, h] for s, q, h in shards}, root=root)
    return checkpoint


def checkpoint_due(*, at_start: bool = False) -> bool:
    """Whether the head needs a checkpoint now: it moved since the newest one and, unless
    `at_start`, AUDIT_CHECKPOINT_ENTRIES entries were added or AUDIT_CHECKPOINT_INTERVAL_S
    passed since it. Read from the database's notes, so polling it never lists the store."""
    heads = chain.chain_heads()
    if not heads:
        return False
    latest = (CheckpointRecord.objects.order_by("-sequence", "-created_at")
              .values_list("sequence", "hash", "created_at", "heads").first())
    if latest is None:
        return True
    signed = {int(shard): tuple(head) for shard, head in latest[3].items()} or {0: (latest[0], latest[1])}
    if signed == heads:
        return False
    added = sum(head[0] - signed.get(shard, (0, ""))[0] for shard, head in heads.items())
    if at_start or added >= settings.AUDIT_CHECKPOINT_ENTRIES:
        return True
    return now() - latest[2] >= timedelta(seconds=settings.AUDIT_CHECKPOINT_INTERVAL_S)


def checkpoint_if_due(*, reason: str = "schedule", at_start: bool = False) -> Checkpoint | None:
    """`checkpoint_write` when `checkpoint_due`; else None."""
    if not checkpoint_due(at_start=at_start):
        return None
    return checkpoint_write(reason=reason)


def checkpoints_read(store: CheckpointStore | None = None) -> tuple[list[Checkpoint], list[str]]:
    """The trusted checkpoints of the store (sorted by sequence), and every file refused.

    A file that is not a checkpoint, is signed by an unknown key or whose signature does not
    verify is refused with its reason: in the checkpoint store, that is itself a finding.
    """
    _names, valid, problems = _read(store or checkpoint_store())
    return valid, problems


def _read(store: CheckpointStore) -> tuple[list[str], list[Checkpoint], list[str]]:
    names = store.names()
    if not names:
        return [], [], []
    keys = signing.trusted_keys()
    valid, problems = [], []
    for name in names:
        try:
            checkpoint = Checkpoint.from_document(json.loads(store.read(name).decode("utf-8")), name)
        except (OSError, ValueError) as exc:
            problems.append(f"{name} is not a readable checkpoint ({exc})")
            continue
        problem = checkpoint.problem(keys)
        if problem:
            problems.append(problem)
        else:
            valid.append(checkpoint)
    valid.sort(key=lambda c: (c.sequence, c.created_at))
    return names, valid, problems


@dataclass(frozen=True)
class AnchorReport:
    """The ledger compared with its checkpoints."""

    checked: int                       # checkpoints compared with entries in the ledger
    latest: Checkpoint | None          # the newest checkpoint the ledger matches
    problems: list[str]                # the ledger contradicts a checkpoint (or one is forged)
    predating: int = 0                 # checkpoints of entries pruned since
    # A checkpoint expected and not found (removed from the store, or never written).
    missing: list[str] = field(default_factory=list)
    store: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems and not self.missing


def _hashes_at(sequences: list[int], shard: int = 0) -> dict[int, str]:
    found: dict[int, str] = {}
    for start in range(0, len(sequences), 500):
        found.update(AuditEntry.objects.filter(shard=shard, sequence__in=sequences[start:start + 500])
                     .values_list("sequence", "hash"))
    return found


def _span(first: int, last: int) -> str:
    return f"entry {first}" if first == last else f"entries {first}..{last}"


def _entries(first: int, last: int) -> str:
    return f"{_span(first, last)} {'was' if first == last else 'were'}"


def ledger_anchor_check(report: chain.Report, store: CheckpointStore | None = None) -> AnchorReport:
    """Compare the ledger, whose chain `report` found intact, with its signed checkpoints.

    Finds a truncated tail (a checkpoint's sequence lies beyond the ledger's head) and a
    rewritten history (the entry at a checkpoint's sequence has another hash); for a rewrite
    it names the newest checkpoint the ledger still matches, which bounds where it happened.
    Then says which checkpoints are expected and missing (`missing`).
    """
    store = store or checkpoint_store()
    names, checkpoints, problems = _read(store)
    head = report.head_sequence or 0
    first = report.first_sequence or head + 1
    beyond = [c for c in checkpoints if c.sequence > head]
    if beyond:
        newest = beyond[-1]
        ends = f"ends at sequence {head}" if head else "is empty"
        problems.append(
            f"the tail was truncated: the ledger {ends} but {newest.describe()} records the head "
            f"at sequence {newest.sequence}, so {_entries(head + 1, newest.sequence)} deleted "
            "(or the database was restored from an older backup)")
    within = [c for c in checkpoints if first <= c.sequence <= head]
    actual = _hashes_at(sorted({c.sequence for c in within}))
    matched = [c for c in within if actual.get(c.sequence) == c.hash]
    mismatched = [c for c in within if actual.get(c.sequence) != c.hash]
    if mismatched:
        bad = mismatched[0]
        good = [c for c in matched if c.sequence < bad.sequence]
        where = (f"the ledger still matches {good[-1].describe()} at sequence {good[-1].sequence}, "
                 f"so the change lies in sequences {good[-1].sequence + 1}..{bad.sequence}"
                 if good else f"the change lies in sequences {first}..{bad.sequence}")
        problems.append(
            f"history was rewritten: the entry at sequence {bad.sequence} has hash "
            f"{str(actual.get(bad.sequence))[:16]}... but {bad.describe()} signed "
            f"{bad.hash[:16]}...; {where}")
    problems += _shard_problems(checkpoints, report)
    covered = matched[-1].sequence if matched else first - 1
    # A file present but refused (forged, unreadable) is one of `problems`, not missing.
    missing = _missing(store, set(names), first=first, head=head, covered=covered)
    return AnchorReport(len(within), matched[-1] if matched and not problems else None, problems,
                        predating=len([c for c in checkpoints if c.sequence < first]),
                        missing=missing, store=store.describe())


def _shard_problems(checkpoints: list[Checkpoint], report: chain.Report) -> list[str]:
    """Every other shard's heads the checkpoints signed, compared with that shard's chain as
    `report` walked it: a head beyond the chain's end (a truncated tail) or an entry at a
    signed head with another hash (a rewritten history); the first of each, per shard."""
    signed: dict[int, dict[int, list[tuple[Checkpoint, str]]]] = {}
    for checkpoint in checkpoints:
        for shard, sequence, hash in checkpoint.shards:
            if shard:
                signed.setdefault(shard, {}).setdefault(sequence, []).append((checkpoint, hash))
    problems = []
    for shard, by_sequence in sorted(signed.items()):
        # Heads a prune has since deleted predate the chain as it stands (as in shard 0).
        first = chain.first_sequence(shard) or 1
        by_sequence = {sequence: signed for sequence, signed in by_sequence.items() if sequence >= first}
        head = report.heads.get(shard, (0, ""))[0]
        beyond = [sequence for sequence in by_sequence if sequence > head]
        if beyond:
            last = max(beyond)
            problems.append(
                f"shard {shard}'s tail was truncated: its chain ends at sequence {head} but "
                f"{by_sequence[last][0][0].describe()} records its head at sequence {last}")
        within = sorted(sequence for sequence in by_sequence if sequence <= head)
        actual = _hashes_at(within, shard)
        wrong = next(((sequence, checkpoint, hash) for sequence in within
                      for checkpoint, hash in by_sequence[sequence] if actual.get(sequence) != hash), None)
        if wrong:
            sequence, checkpoint, hash = wrong
            problems.append(
                f"history was rewritten in shard {shard}: the entry at sequence {sequence} has hash "
                f"{str(actual.get(sequence))[:16]}... but {checkpoint.describe()} signed {hash[:16]}...")
    return problems


def _missing(store: CheckpointStore, present: set[str], *, first: int, head: int,
             covered: int) -> list[str]:
    where = store.describe()
    missing = [
        f"{name}, the checkpoint of sequence {sequence} written {chain.timestamp_text(created)} to "
        f"{written}, is missing from {where} (it was removed, or the store is not the one it "
        "was written to)"
        for name, sequence, created, written in CheckpointRecord.objects
        .filter(sequence__gte=first).order_by("sequence", "created_at")
        .values_list("name", "sequence", "created_at", "store").iterator()
        if name not in present]
    if head and covered < head:
        oldest = (AuditEntry.objects.filter(shard=0, sequence__gt=covered).order_by("sequence")
                  .values_list("sequence", "created_at").first())
        window = settings.AUDIT_CHECKPOINT_INTERVAL_S + settings.AUDIT_CHECKPOINT_GRACE_S
        if oldest is not None and now() - oldest[1] > timedelta(seconds=window):
            missing.append(
                f"{_span(oldest[0], head)} {'is' if oldest[0] == head else 'are'} covered by no "
                f"signed checkpoint in {where}, and entry {oldest[0]} was recorded at "
                f"{chain.timestamp_text(oldest[1])}, more than {window:g} s ago "
                "(AUDIT_CHECKPOINT_INTERVAL_S + AUDIT_CHECKPOINT_GRACE_S): its checkpoint was "
                "removed, or none is being written (is the audit worker running, with the "
                "signing key?)")
    return missing


def checkpoint_trusted(record: CheckpointRecord, store: CheckpointStore | None = None) -> tuple[Checkpoint | None, str]:
    """The checkpoint `record` notes, read from its store with its signature checked, or None
    and why it cannot be trusted (unreadable, forged, not the one noted)."""
    store = store or checkpoint_store()
    try:
        checkpoint = Checkpoint.from_document(json.loads(store.read(record.name)), record.name)
    except (OSError, ValueError) as exc:
        return None, f"the checkpoint {record.name} could not be read from {store.describe()} ({exc})"
    problem = checkpoint.problem(signing.trusted_keys())
    if problem:
        return None, problem
    if (checkpoint.sequence, checkpoint.hash) != (record.sequence, record.hash):
        return None, f"the checkpoint {record.name} is not the one the database notes"
    return checkpoint, ""
