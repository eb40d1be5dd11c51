"""Exports of the ledger for a time range, and their offline verification.

An export is a JSON Lines or CSV file plus `<file>.manifest.json`. The manifest holds the
chain link into the export (`anchor_prev_hash`: the prev_hash of its first entry), the hash of
its last entry, the ledger head when it was taken and the file's SHA-256. `verify_export`
recomputes every digest and link from the file alone, with no database; consecutive exports
chain (each one's anchor is the previous one's `export_head_hash`), so a reviewer who kept
the previous manifest, or the published head, can tell that nothing was cut out in between.
The manifest also carries a signed checkpoint of the ledger head (`audit.anchoring`): an
export rewritten whole, chain and manifest recomputed, no longer matches its signature.

Entries are chosen by time but exported as a contiguous run of sequences (from the first
entry created at or after `start` to the last created before `end`): the chain cannot have
holes, and an entry's time is taken when it is recorded while its sequence is fixed when its
transaction commits, so a few entries at the edges may lie just outside the range.
"""
from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from orchestrator.engine.clock import now

from . import anchoring, chain, signing
from .models import AuditEntry

FIELDS = ("id", "sequence", "created_at", "actor", "actor_kind", "action", "subject_type",
          "subject_id", "team", "workflow", "workflow_version", "definition_digest", "run_id",
          "step_name", "event_id", "proposal_hash", "model", "prompt_version", "idempotency_key",
          "correlation_id", "outcome", "payload", "payload_ref", "digest", "prev_hash", "hash")
INT_FIELDS = {"id", "sequence", "workflow_version", "event_id"}
NULLABLE_TEXT = {"run_id"}
FORMATS = ("jsonl", "csv")
HASH_FORMULA = ("digest = sha256(canonical JSON of the content fields); "
                "hash = sha256(prev_hash + ':' + sequence + ':' + digest); "
                "canonical JSON = sorted keys, no spaces, ASCII; payload is hashed as its text")


@dataclass(frozen=True)
class ExportResult:
    path: Path
    manifest_path: Path
    manifest: dict


def manifest_path_for(path: Path) -> Path:
    return path.with_name(path.name + ".manifest.json")


def _selected(start: datetime, end: datetime):
    sealed = AuditEntry.objects.filter(sequence__isnull=False)
    first = (sealed.filter(created_at__gte=start, created_at__lt=end).order_by("sequence")
             .values_list("sequence", flat=True).first())
    last = (sealed.filter(created_at__gte=start, created_at__lt=end).order_by("-sequence")
            .values_list("sequence", flat=True).first())
    if first is None:
        return sealed.none()
    return sealed.filter(sequence__gte=first, sequence__lte=last).order_by("sequence")


def export_range(*, start: datetime, end: datetime, fmt: str, path: Path) -> ExportResult:
    """Write the entries of [start, end) to `path` in `fmt`, and the manifest beside it."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    # The head, signed and written to AUDIT_CHECKPOINT_DIR: the manifest carries it, so the
    # export can be checked against a key the database does not hold (audit.anchoring).
    checkpoint = anchoring.checkpoint_write(reason="export")
    head = (checkpoint.sequence, checkpoint.hash) if checkpoint else None
    count, first_row, last_row = 0, None, None
    with path.open("w", newline="", encoding="utf-8") as out:
        writer = csv.DictWriter(out, fieldnames=FIELDS) if fmt == "csv" else None
        if writer:
            writer.writeheader()
        for entry in _selected(start, end).iterator(chunk_size=2000):
            row = {"id": entry.id, **chain.entry_row(entry)}
            if writer:
                writer.writerow({k: "" if row[k] is None else row[k] for k in FIELDS})
            else:
                out.write(json.dumps({k: row[k] for k in FIELDS}, ensure_ascii=False) + "\n")
            count += 1
            first_row = first_row or row
            last_row = row
    manifest = {
        "generated_by": "stepwise audit_export",
        "exported_at": chain.timestamp_text(now()),
        "format": fmt,
        "file": path.name,
        "file_sha256": _file_sha256(path),
        "range": {"from": chain.timestamp_text(start), "to": chain.timestamp_text(end)},
        "count": count,
        "first_sequence": first_row["sequence"] if first_row else None,
        "last_sequence": last_row["sequence"] if last_row else None,
        "anchor_prev_hash": first_row["prev_hash"] if first_row else None,
        "export_head_hash": last_row["hash"] if last_row else None,
        "ledger_head": {"sequence": head[0], "hash": head[1]} if head else None,
        "checkpoint": checkpoint.document() if checkpoint else None,
        "hash_formula": HASH_FORMULA,
    }
    manifest_path = manifest_path_for(path)
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return ExportResult(path, manifest_path, manifest)


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_rows(path: Path, fmt: str) -> Iterator[dict]:
    """The entry rows of an export file, typed as the digest expects them."""
    with path.open(newline="", encoding="utf-8") as handle:
        if fmt == "jsonl":
            for line in handle:
                if line.strip():
                    yield json.loads(line)
            return
        for raw in csv.DictReader(handle):
            row: dict = dict(raw)
            for name in INT_FIELDS:
                row[name] = int(row[name]) if row[name] not in ("", None) else None
            for name in NULLABLE_TEXT:
                row[name] = row[name] or None
            yield row


def verify_export(path: Path, *, previous_manifest: Path | None = None) -> tuple[chain.Report, list[str]]:
    """Check an export against its manifest (and the previous export's, if given).

    Returns the chain report and a list of manifest problems (file changed, wrong count,
    head mismatch, gap after the previous export); both empty/ok means the export is intact.
    """
    manifest = json.loads(manifest_path_for(path).read_text(encoding="utf-8"))
    problems = []
    if _file_sha256(path) != manifest["file_sha256"]:
        problems.append("the file's SHA-256 does not match the manifest (the file was changed)")
    if manifest["count"] == 0:
        return chain.Report(0, None, None, None), problems
    report = chain.verify_rows(read_rows(path, manifest["format"]),
                               anchor=manifest["anchor_prev_hash"], start=manifest["first_sequence"])
    if report.ok:
        if report.count != manifest["count"]:
            problems.append(f"the manifest lists {manifest['count']} entries, the file holds {report.count}")
        if report.head_hash != manifest["export_head_hash"]:
            problems.append("the last entry's hash is not the manifest's export_head_hash")
    problems += _checkpoint_problems(path, manifest)
    if previous_manifest is not None:
        before = json.loads(previous_manifest.read_text(encoding="utf-8"))
        if before.get("export_head_hash") and (
                before["last_sequence"] + 1 != manifest["first_sequence"]
                or before["export_head_hash"] != manifest["anchor_prev_hash"]):
            problems.append("this export does not continue the previous one (entries are missing between them)")
    return report, problems


def _checkpoint_problems(path: Path, manifest: dict) -> list[str]:
    """The manifest's signed checkpoint: trusted, the manifest's head, and the file's entry."""
    if not manifest.get("checkpoint"):
        return [] if manifest["count"] == 0 else ["the manifest carries no signed checkpoint"]
    try:
        checkpoint = anchoring.Checkpoint.from_document(manifest["checkpoint"])
    except ValueError as exc:
        return [f"the manifest's checkpoint is not readable ({exc})"]
    problem = checkpoint.problem(signing.trusted_keys())
    if problem:
        return [f"the manifest's {problem}"]
    head = manifest.get("ledger_head") or {}
    if (head.get("sequence"), head.get("hash")) != (checkpoint.sequence, checkpoint.hash):
        return ["the manifest's ledger_head is not the head its checkpoint signed"]
    first, last = manifest["first_sequence"], manifest["last_sequence"]
    if first is not None and first <= checkpoint.sequence <= last:
        found = next((row.get("hash") for row in read_rows(path, manifest["format"])
                      if row.get("sequence") == checkpoint.sequence), None)
        if found != checkpoint.hash:
            return [f"the entry at sequence {checkpoint.sequence} does not have the hash the "
                    "manifest's checkpoint signed (the export was rewritten)"]
    return []
