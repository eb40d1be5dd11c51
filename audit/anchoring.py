"""Anchoring: signed checkpoints of the chain head, kept out of the database, and the check
of the ledger against them.

Why: the hash chain (`audit.chain`) shows that entries were changed only to someone who
cannot rewrite it. Whoever can write to the database can drop the triggers, edit an entry,
recompute every digest and hash after it and restore the triggers, or delete the newest
entries: either way the chain is consistent again and `verify_ledger` passes. A checkpoint
records the head — sequence, hash, time — signed with an Ed25519 key the database does not
hold (`audit.signing`), in a file outside the database (AUDIT_CHECKPOINT_DIR). Each hash
covers every entry before it, so one checkpoint vouches for the whole chain up to its
sequence: a rewritten history no longer reaches the signed hash, and a truncated tail no
longer reaches the signed sequence.

- `checkpoint_write(reason=...)` signs the current head and writes it (beat, through
  `audit.tasks.checkpoint`, every AUDIT_CHECKPOINT_INTERVAL_S; `audit_export`, whose manifest
  carries it; `manage.py audit_checkpoint`).
- `checkpoints_read()` reads the directory and checks every signature.
- `ledger_anchor_check(report)` compares a chain that `chain.verify_ledger` walked with them.

A checkpoint file (`checkpoint-<sequence>-<time>.json`):

    {"format": "stepwise-audit-checkpoint/1", "sequence": 1234, "hash": "<64 hex>",
     "created_at": "2026-01-31T12:00:00.000000+00:00", "reason": "schedule",
     "key_id": "ed25519:<16 hex>", "signature": "<base64>"}

The signature is Ed25519 over the canonical JSON of the first five fields. Entries newer
than the latest checkpoint are not anchored yet: the interval is the window.

This module reads the ledger and writes checkpoint files; it must not change the ledger.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from orchestrator.clock import now

from . import chain, signing
from .models import AuditEntry

FORMAT = "stepwise-audit-checkpoint/1"
SIGNED_FIELDS = ("format", "sequence", "hash", "created_at", "reason")
FIELDS = (*SIGNED_FIELDS, "key_id", "signature")
GLOB = "checkpoint-*.json"


@dataclass(frozen=True)
class Checkpoint:
    sequence: int
    hash: str
    created_at: str
    reason: str
    key_id: str
    signature: str
    path: Path | None = None

    @staticmethod
    def signed_text(sequence: int, hash: str, created_at: str, reason: str) -> bytes:
        return chain.canonical_json({"format": FORMAT, "sequence": sequence, "hash": hash,
                                     "created_at": created_at, "reason": reason}).encode()

    def document(self) -> dict:
        return {"format": FORMAT, "sequence": self.sequence, "hash": self.hash,
                "created_at": self.created_at, "reason": self.reason, "key_id": self.key_id,
                "signature": self.signature}

    @classmethod
    def from_document(cls, document: object, path: Path | None = None) -> Checkpoint:
        """Raises ValueError when `document` is not a checkpoint of this format."""
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} document")
        missing = [name for name in FIELDS if name not in document]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        if not isinstance(document["sequence"], int) or isinstance(document["sequence"], bool):
            raise ValueError("sequence is not an integer")
        return cls(document["sequence"], str(document["hash"]), str(document["created_at"]),
                   str(document["reason"]), str(document["key_id"]), str(document["signature"]),
                   path)

    @property
    def name(self) -> str:
        return self.path.name if self.path else f"checkpoint at sequence {self.sequence}"

    def describe(self) -> str:
        return f"checkpoint {self.name} (signed {self.created_at} by {self.key_id})"

    def problem(self, keys: dict) -> str | None:
        """Why this checkpoint cannot be trusted with `keys` (signing.trusted_keys()), or None."""
        key = keys.get(self.key_id)
        if key is None:
            return (f"{self.name} is signed by {self.key_id}, which is not a trusted key (after a "
                    "rotation, list the old public key in AUDIT_VERIFY_KEYS)")
        message = self.signed_text(self.sequence, self.hash, self.created_at, self.reason)
        if not signing.signature_valid(key, message, self.signature):
            return f"{self.name}: the signature does not verify (the file was changed or forged)"
        return None


def checkpoint_dir() -> Path:
    return Path(settings.AUDIT_CHECKPOINT_DIR)


def _latest_file(directory: Path) -> Checkpoint | None:
    # File names start with the zero-padded sequence, so the last name is the newest head.
    for path in sorted(directory.glob(GLOB), reverse=True):
        try:
            return Checkpoint.from_document(json.loads(path.read_text(encoding="utf-8")), path)
        except (OSError, ValueError):
            continue
    return None


def checkpoint_write(*, reason: str, skip_if_unchanged: bool = False) -> Checkpoint | None:
    """Sign the ledger's current head and write it to AUDIT_CHECKPOINT_DIR; return it.

    Returns None when the ledger is empty. With `skip_if_unchanged`, returns the newest
    checkpoint instead of writing one when it already records this head (the schedule).
    Raises ImproperlyConfigured when no signing key is configured.
    """
    chain.seal_pending()
    head = chain.chain_head()
    if head is None:
        return None
    directory = checkpoint_dir()
    directory.mkdir(parents=True, exist_ok=True)
    if skip_if_unchanged:
        latest = _latest_file(directory)
        if latest is not None and (latest.sequence, latest.hash) == head:
            return latest
    created = now()
    created_at = chain.timestamp_text(created)
    key_id, signature = signing.sign(Checkpoint.signed_text(head[0], head[1], created_at, reason))
    path = directory / f"checkpoint-{head[0]:012d}-{created:%Y%m%dT%H%M%S%fZ}.json"
    checkpoint = Checkpoint(head[0], head[1], created_at, reason, key_id, signature, path)
    # Written whole under a temporary name, then renamed: a reader never sees half a file.
    temporary = path.with_name(f".{path.name}.tmp")
    with temporary.open("w", encoding="utf-8") as handle:
        handle.write(json.dumps(checkpoint.document(), indent=2) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    return checkpoint


def checkpoints_read(directory: Path | None = None) -> tuple[list[Checkpoint], list[str]]:
    """The trusted checkpoints of `directory` (sorted by sequence), and every file refused.

    A file that is not a checkpoint, is signed by an unknown key or whose signature does not
    verify is refused with its reason: in the checkpoint directory, that is itself a finding.
    """
    directory = directory or checkpoint_dir()
    paths = sorted(directory.glob(GLOB)) if directory.is_dir() else []
    if not paths:
        return [], []
    keys = signing.trusted_keys()
    valid, problems = [], []
    for path in paths:
        try:
            checkpoint = Checkpoint.from_document(json.loads(path.read_text(encoding="utf-8")), path)
        except (OSError, ValueError) as exc:
            problems.append(f"{path.name} is not a readable checkpoint ({exc})")
            continue
        problem = checkpoint.problem(keys)
        if problem:
            problems.append(problem)
        else:
            valid.append(checkpoint)
    valid.sort(key=lambda c: (c.sequence, c.created_at))
    return valid, problems


@dataclass(frozen=True)
class AnchorReport:
    """The ledger compared with its checkpoints."""

    checked: int                       # checkpoints compared with entries in the ledger
    latest: Checkpoint | None          # the newest checkpoint the ledger matches
    problems: list[str]
    predating: int = 0                 # checkpoints of entries pruned since

    @property
    def ok(self) -> bool:
        return not self.problems


def _hashes_at(sequences: list[int]) -> dict[int, str]:
    found: dict[int, str] = {}
    for start in range(0, len(sequences), 500):
        found.update(AuditEntry.objects.filter(sequence__in=sequences[start:start + 500])
                     .values_list("sequence", "hash"))
    return found


def _entries(first: int, last: int) -> str:
    return f"entry {first} was" if first == last else f"entries {first}..{last} were"


def ledger_anchor_check(report: chain.Report, directory: Path | None = None) -> AnchorReport:
    """Compare the ledger, whose chain `report` found intact, with its signed checkpoints.

    Finds a truncated tail (a checkpoint's sequence lies beyond the ledger's head) and a
    rewritten history (the entry at a checkpoint's sequence has another hash); for a rewrite
    it names the newest checkpoint the ledger still matches, which bounds where it happened.
    """
    checkpoints, problems = checkpoints_read(directory)
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
    return AnchorReport(len(within), matched[-1] if matched and not problems else None, problems,
                        predating=len([c for c in checkpoints if c.sequence < first]))
