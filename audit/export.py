"""Exports of the ledger for a time range, and their offline verification.

An export is a JSON Lines or CSV file plus `<file>.manifest.json`. The manifest holds the
chain link into the export (`anchor_prev_hash`: the prev_hash of its first entry), the hash of
its last entry, the ledger head when it was taken and the file's SHA-256. `verify_export`
recomputes every digest and link from the file alone, with no database; consecutive exports
chain (each one's anchor is the previous one's `export_head_hash`), so a reviewer who kept
the previous manifest, or the published head, can tell that nothing was cut out in between.
The manifest also carries a signed checkpoint of the ledger head (`audit.anchoring`): an
export rewritten whole, chain and manifest recomputed, no longer matches its signature.

The ledger is a chain per shard (`audit.chain`). Entries are chosen by time but exported as a
contiguous run of sequences of each shard (from its first entry created at or after `start`
to its last created before `end`), ordered by shard then sequence: a chain cannot have holes, and an entry's time is taken when it is recorded while its sequence is fixed when its
transaction commits, so a few entries at the edges may lie just outside the range. The
manifest's top-level range is shard 0's; with entries of other shards, `shards` holds each
shard's range (`count`, `first_sequence`, `last_sequence`, `anchor_prev_hash`,
`export_head_hash`), and an export without a `shard` column is shard 0's.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from itertools import groupby
from pathlib import Path

from django.db.models import Q

from orchestrator.engine.clock import now

from . import anchoring, chain, signing
from .models import AuditEntry

FIELDS = ("id", "sequence", "created_at", "actor", "actor_kind", "action", "subject_type",
          "subject_id", "team", "workflow", "workflow_version", "definition_digest", "run_id",
          "step_name", "event_id", "proposal_hash", "model", "prompt_version", "idempotency_key",
          "correlation_id", "outcome", "payload", "payload_ref", "digest", "prev_hash", "hash",
          "shard")
INT_FIELDS = {"id", "sequence", "workflow_version", "event_id", "shard"}
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
    ranges = Q(pk__in=[])
    for shard in chain.shards_present():
        inside = sealed.filter(shard=shard, created_at__gte=start, created_at__lt=end)
        first = inside.order_by("sequence").values_list("sequence", flat=True).first()
        last = inside.order_by("-sequence").values_list("sequence", flat=True).first()
        if first is not None:
            ranges |= Q(shard=shard, sequence__gte=first, sequence__lte=last)
    return sealed.filter(ranges).order_by("shard", "sequence")


def _sequences(ranges: dict[int, tuple[int, int]]):
    which = Q(pk__in=[])
    for shard, (first, last) in ranges.items():
        which |= Q(shard=shard, sequence__gte=first, sequence__lte=last)
    return AuditEntry.objects.filter(which).order_by("shard", "sequence")


def export_range(*, start: datetime, end: datetime, fmt: str, path: Path,
                 sequences: dict[int, tuple[int, int]] | None = None) -> ExportResult:
    """Write the entries of [start, end) to `path` in `fmt`, and the manifest beside it; with
    `sequences` {shard: (first, last)}, exactly those entries (what a prune is about to delete)."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    # The head, signed and written to AUDIT_CHECKPOINT_DIR: the manifest carries it, so the
    # export can be checked against a key the database does not hold (audit.anchoring).
    checkpoint = anchoring.checkpoint_write(reason="export")
    head = (checkpoint.sequence, checkpoint.hash) if checkpoint else None
    count, ranges = 0, {}
    with path.open("w", newline="", encoding="utf-8") as out:
        writer = csv.DictWriter(out, fieldnames=FIELDS) if fmt == "csv" else None
        if writer:
            writer.writeheader()
        selected = _selected(start, end) if sequences is None else _sequences(sequences)
        for entry in selected.iterator(chunk_size=2000):
            row = {"id": entry.id, **chain.entry_row(entry)}
            if writer:
                writer.writerow({k: "" if row[k] is None else row[k] for k in FIELDS})
            else:
                out.write(json.dumps({k: row[k] for k in FIELDS}, ensure_ascii=False) + "\n")
            count += 1
            shard = ranges.setdefault(row["shard"], {"count": 0, "first": row, "last": row})
            shard["count"] += 1
            shard["last"] = row
    first_row, last_row = (ranges[0]["first"], ranges[0]["last"]) if 0 in ranges else (None, None)
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
        **({"shards": {str(shard): _range_of(part) for shard, part in sorted(ranges.items())}}
           if set(ranges) - {0} else {}),
        "ledger_head": {"sequence": head[0], "hash": head[1]} if head else None,
        "checkpoint": checkpoint.document() if checkpoint else None,
        "hash_formula": HASH_FORMULA,
    }
    manifest_path = manifest_path_for(path)
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return ExportResult(path, manifest_path, manifest)


def _range_of(part: dict) -> dict:
    return {"count": part["count"], "first_sequence": part["first"]["sequence"],
            "last_sequence": part["last"]["sequence"], "anchor_prev_hash": part["first"]["prev_hash"],
            "export_head_hash": part["last"]["hash"]}


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
                if name in row:
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
    if manifest.get("shards"):
        return _verify_shards(path, manifest, problems)
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


def _verify_shards(path: Path, manifest: dict, problems: list[str]) -> tuple[chain.Report, list[str]]:
    """An export holding several shards: each shard's rows walked as its own chain from the
    range its manifest gives; the report's count is every shard's, its head shard 0's."""
    ranges = {int(shard): part for shard, part in manifest["shards"].items()}
    total, heads, zero = 0, {}, chain.Report(0, None, None, None)
    rows = read_rows(path, manifest["format"])
    for shard, part in groupby(rows, key=lambda row: row.get("shard") or 0):
        expected = ranges.pop(shard, None)
        if expected is None:
            problems.append(f"the file holds entries of shard {shard}, which the manifest does not list")
            continue
        report = chain.verify_rows(part, anchor=expected["anchor_prev_hash"], start=expected["first_sequence"])
        total += report.count
        if report.broken is not None:
            return chain.Report(total, None, None, None, replace(report.broken, shard=shard)), problems
        heads[shard] = (report.head_sequence, report.head_hash)
        zero = report if shard == 0 else zero
        if report.count != expected["count"] or report.head_hash != expected["export_head_hash"]:
            problems.append(f"shard {shard}'s entries are not the {expected['count']} its manifest "
                            "range lists, ending at its export_head_hash")
    problems += [f"the manifest lists entries of shard {shard} the file does not hold" for shard in ranges]
    if total != manifest["count"]:
        problems.append(f"the manifest lists {manifest['count']} entries, the file holds {total}")
    problems += _checkpoint_problems(path, manifest)
    return replace(zero, count=total, heads=heads), problems


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
    ranges = {int(shard): (part["first_sequence"], part["last_sequence"])
              for shard, part in (manifest.get("shards") or {}).items()}
    ranges.setdefault(0, (manifest["first_sequence"], manifest["last_sequence"]))
    for shard, (sequence, hash) in sorted(checkpoint.heads.items()):
        first, last = ranges.get(shard, (None, None))
        if first is not None and first <= sequence <= last:
            found = next((row.get("hash") for row in read_rows(path, manifest["format"])
                          if (row.get("shard") or 0) == shard and row.get("sequence") == sequence), None)
            if found != hash:
                where = f"shard {shard}'s entry" if shard else "the entry"
                return [f"{where} at sequence {sequence} does not have the hash the "
                        "manifest's checkpoint signed (the export was rewritten)"]
    return []


# --- a selection of entries, streamed ---------------------------------------------------------

STREAM_FORMAT = "stepwise-audit-selection/1"
_CONTENT_TYPES = {"jsonl": "application/x-ndjson", "csv": "text/csv"}


def content_type(fmt: str) -> str:
    return _CONTENT_TYPES[fmt]


def stream_lines(entries, fmt: str) -> Iterator[str]:
    """The export file of `entries` (a queryset in chain order), as pieces of text: the same
    bytes for the same entries, so its manifest can be computed by reading them again."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}")
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=FIELDS) if fmt == "csv" else None
    if writer:
        writer.writeheader()
    for count, entry in enumerate(entries.iterator(chunk_size=2000), start=1):
        row = {"id": entry.id, **chain.entry_row(entry)}
        if writer:
            writer.writerow({k: "" if row[k] is None else row[k] for k in FIELDS})
        else:
            buffer.write(json.dumps({k: row[k] for k in FIELDS}, ensure_ascii=False) + "\n")
        if count % 500 == 0:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    if buffer.tell():
        yield buffer.getvalue()


def stream_manifest(*, entries, fmt: str, selection: dict, through: int,
                    checkpoint: anchoring.Checkpoint) -> dict:
    """The manifest of `stream_lines(entries, fmt)`: the file's SHA-256, its entries, and the
    signed checkpoint of the chain through `through`, the last sequence it may hold."""
    digest, count, first, last = hashlib.sha256(), 0, None, None
    for piece in stream_lines(entries, fmt):
        digest.update(piece.encode("utf-8"))
    for sequence in entries.values_list("sequence", flat=True).iterator(chunk_size=5000):
        count += 1
        first = sequence if first is None else first
        last = sequence
    return {
        "format": STREAM_FORMAT,
        "generated_by": "stepwise ledger API",
        "exported_at": chain.timestamp_text(now()),
        "file_format": fmt,
        "file_sha256": digest.hexdigest(),
        "selection": selection,
        "count": count,
        "first_sequence": first,
        "last_sequence": last,
        "through_sequence": through,
        "checkpoint": checkpoint.document(),
        "hash_formula": HASH_FORMULA,
    }
