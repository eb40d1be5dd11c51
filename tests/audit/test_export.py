"""Exports for a time range, in JSON Lines and CSV, verifiable offline with their manifest."""
import csv
import json
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command

from audit.export import FIELDS, export_range, manifest_path_for, read_rows, verify_export
from orchestrator.engine.clock import now

from .conftest import ledger

pytestmark = pytest.mark.django_db


@pytest.fixture
def window(support_run):
    entries = ledger(run_id=support_run.id)
    return entries, entries[0].created_at, entries[-1].created_at + timedelta(microseconds=1)


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_an_export_holds_the_range_and_verifies_offline(window, tmp_path, fmt):
    entries, start, end = window
    path = tmp_path / f"ledger.{fmt}"

    result = export_range(start=start, end=end, fmt=fmt, path=path)
    report, problems = verify_export(path)

    manifest = result.manifest
    exported = list(read_rows(path, fmt))
    assert {e.id for e in entries} <= {r["id"] for r in exported}
    assert manifest["count"] == len(exported)
    assert manifest["export_head_hash"] == exported[-1]["hash"]
    assert manifest["anchor_prev_hash"] == exported[0]["prev_hash"]
    assert manifest["ledger_head"]["sequence"] >= manifest["last_sequence"]
    assert report.ok and problems == [], (report.broken, problems)


def rewrite(path, fmt, index, **changes) -> None:
    """Edit one exported entry the way someone with the file would."""
    if fmt == "jsonl":
        lines = path.read_text().splitlines()
        lines[index] = json.dumps({**json.loads(lines[index]), **changes})
        path.write_text("\n".join(lines) + "\n")
        return
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    rows[index].update(changes)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_an_edited_export_fails_verification_at_the_edited_entry(window, tmp_path, fmt):
    _, start, end = window
    path = tmp_path / f"ledger.{fmt}"
    export_range(start=start, end=end, fmt=fmt, path=path)
    victim = list(read_rows(path, fmt))[3]
    rewrite(path, fmt, 3, actor="user:mallory")

    report, problems = verify_export(path)

    assert (report.broken.sequence, report.broken.entry_id) == (victim["sequence"], victim["id"])
    assert "edited" in report.broken.reason
    assert "changed" in problems[0]


def test_consecutive_exports_chain_and_a_gap_between_them_is_detected(window, tmp_path):
    entries, start, end = window
    middle = entries[len(entries) // 2].created_at
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    export_range(start=start, end=middle, fmt="jsonl", path=first)
    export_range(start=middle, end=end, fmt="jsonl", path=second)

    assert verify_export(second, previous_manifest=manifest_path_for(first))[1] == []

    manifest = json.loads(manifest_path_for(first).read_text())
    manifest["last_sequence"] -= 1
    manifest["export_head_hash"] = "0" * 64
    manifest_path_for(first).write_text(json.dumps(manifest))
    assert "does not continue" in verify_export(second, previous_manifest=manifest_path_for(first))[1][0]


def test_the_commands_export_and_verify(window, tmp_path, capsys):
    _, start, end = window
    path = tmp_path / "cmd.csv"

    call_command("audit_export", "--from", start.isoformat(), "--to", end.isoformat(),
                 "--format", "csv", "--output", str(path))
    call_command("audit_verify", "--export", str(path))

    out = capsys.readouterr().out
    assert f"to {path}" in out and "OK" in out
    path.write_text(path.read_text() + "\n")
    with pytest.raises(CommandError, match="changed"):
        call_command("audit_verify", "--export", str(path))


def test_an_empty_range_exports_nothing(tmp_path):
    path = tmp_path / "empty.jsonl"
    result = export_range(start=now() + timedelta(days=1), end=now() + timedelta(days=2),
                          fmt="jsonl", path=path)
    assert result.manifest["count"] == 0 and path.read_text() == ""
    assert verify_export(path)[0].ok
