"""Forgeries built without the code under test: the chain's formulas written out a second time
here (`digest`, `link`), a small chain stored with its hashes as constants, and tampered ledgers
forged with those — so a change of `audit.chain`'s formulas cannot also change the forgery
that is meant to catch it.

The formulas, as docs/audit.md states them:
    digest = SHA-256(canonical JSON of the entry's recorded fields)
    hash   = SHA-256(prev_hash + ":" + sequence + ":" + digest)
with canonical JSON = sorted keys, no spaces, ASCII escapes; the first prev_hash is 64 zeros.
"""
import hashlib
import json
from datetime import UTC

import pytest
from django.db import transaction

from audit.chain import content_digest, link_hash, verify_ledger, verify_rows
from audit.models import AuditEntry
from audit.services import audit_record

from .conftest import ledger, tamper

GENESIS = "0" * 64
# The recorded fields, written out here rather than read from audit.chain: dropping one from
# the digest there must fail these tests.
RECORDED = (
    "created_at", "actor", "actor_kind", "action", "subject_type", "subject_id", "team",
    "workflow", "workflow_version", "definition_digest", "run_id", "step_name", "event_id",
    "proposal_hash", "model", "prompt_version", "idempotency_key", "correlation_id", "outcome",
    "payload", "payload_ref",
)


def digest(row: dict) -> str:
    text = json.dumps({name: row[name] for name in RECORDED}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def link(prev_hash: str, sequence: int, entry_digest: str) -> str:
    return hashlib.sha256(f"{prev_hash}:{sequence}:{entry_digest}".encode("ascii")).hexdigest()


def content(i: int, **changes) -> dict:
    row = dict.fromkeys(RECORDED, "")
    row.update(created_at=f"2026-01-0{i}T12:00:00.000000+00:00", actor="user:ann",
               actor_kind="user", action="run.created", subject_type="run", subject_id=f"r{i}",
               team="support", workflow="support-reply", workflow_version=1, run_id=None,
               event_id=i, payload=f'{{"n":{i},"note":"caf\\u00e9"}}')
    row.update(changes)
    return row


def stored_chain() -> list[dict]:
    rows, prev = [], GENESIS
    for sequence in (1, 2, 3, 4):
        row = {**content(sequence), "id": 100 + sequence, "sequence": sequence, "prev_hash": prev}
        row["digest"] = digest(row)
        row["hash"] = link(prev, sequence, row["digest"])
        rows.append(row)
        prev = row["hash"]
    return rows


# The hashes of that chain, computed once and stored: a change of either formula, of the
# canonical form or of the genesis value breaks the first test below.
STORED_HASHES = [
    "cbcea94a202e999603f06848931b0587255ecff876d35d0983bf824cf06bfd71",
    "01e3b04b66b435118d55cf17b5116256ab1eff87aef522f2e31d4eb702460403",
    "bebeb6749d1d3dd75da54b76d129551cce0e468f41a723d5e0858a24e905267c",
    "dbeb8790ea015ffaa7bb0efcbf1d7ed658ca549c298a21b5ddb77eba07bed7bc",
]


def test_the_stored_chain_has_the_stored_hashes_and_verifies():
    rows = stored_chain()
    assert [r["hash"] for r in rows] == STORED_HASHES
    assert [content_digest(r) for r in rows] == [r["digest"] for r in rows]
    assert [link_hash(r["prev_hash"], r["sequence"], r["digest"]) for r in rows] == STORED_HASHES
    report = verify_rows(rows, anchor=GENESIS, start=1)
    assert report.ok and (report.count, report.head_hash) == (4, STORED_HASHES[-1])


def test_the_first_entry_must_link_to_genesis():
    rows = stored_chain()
    assert not verify_rows(rows, anchor="1" * 64, start=1).ok
    assert verify_rows(rows[1:], anchor=rows[0]["hash"], start=2).ok


def rechain(rows: list[dict], start: int) -> None:
    """Recompute digests and links from index `start` on, as a forger with the formulas would."""
    for i in range(start, len(rows)):
        rows[i]["prev_hash"] = rows[i - 1]["hash"] if i else GENESIS
        rows[i]["digest"] = digest(rows[i])
        rows[i]["hash"] = link(rows[i]["prev_hash"], rows[i]["sequence"], rows[i]["digest"])


def forge(rows: list[dict], how: str) -> list[dict]:
    rows = [dict(r) for r in rows]
    n = 1  # the entry rewritten: sequence 2
    rows[n]["actor"] = "user:mallory"
    if how == "entry rewritten":
        pass
    elif how == "entry rewritten with its digest":
        rows[n]["digest"] = digest(rows[n])
    elif how == "entry rewritten and rehashed":
        rechain(rows[: n + 1], n)
    elif how == "entry rewritten, next entry's prev_hash patched":
        rechain(rows[: n + 1], n)
        rows[n + 1]["prev_hash"] = rows[n]["hash"]
    elif how == "entry rewritten, next entry patched and rehashed":
        rechain(rows[: n + 2], n)
    elif how == "entry removed and the rest renumbered":
        del rows[n]
        for i in range(n, len(rows)):
            rows[i]["sequence"] = i + 1
        rechain(rows, n)
    elif how == "two entries swapped":
        rows[0]["actor"] = "user:ann"
        rows[n], rows[n + 1] = rows[n + 1], rows[n]
    return rows


@pytest.mark.parametrize("how, sequence, reason", [
    ("entry rewritten", 2, "content does not match its digest"),
    ("entry rewritten with its digest", 2, "hash does not match"),
    ("entry rewritten and rehashed", 3, "prev_hash does not match"),
    ("entry rewritten, next entry's prev_hash patched", 3, "hash does not match"),
    ("entry rewritten, next entry patched and rehashed", 4, "prev_hash does not match"),
    ("entry removed and the rest renumbered", None, None),
    ("two entries swapped", 3, "expected sequence 2"),
])
def test_a_forged_chain_is_caught_at_the_first_entry_it_breaks(how, sequence, reason):
    report = verify_rows(forge(stored_chain(), how), anchor=GENESIS, start=1)
    if sequence is None:
        # Rechained to the head, a forgery is a valid chain: only the head differs, which is
        # why the head is anchored outside the database (signed checkpoints, test_anchoring).
        assert report.ok and report.head_hash != STORED_HASHES[-1]
        return
    assert not report.ok
    assert report.broken.sequence == sequence and reason in report.broken.reason


# --- the same forgeries on the ledger in the database -----------------------------------------


def db_row(entry_id: int) -> dict:
    """An entry's recorded fields as the formulas take them, read from the table directly."""
    values = AuditEntry.objects.values(*RECORDED, "sequence", "prev_hash", "hash", "digest").get(id=entry_id)
    values["created_at"] = values["created_at"].astimezone(UTC).isoformat(timespec="microseconds")
    values["run_id"] = str(values["run_id"]) if values["run_id"] else None
    return values


def record(n: int) -> list[int]:
    with transaction.atomic():
        ids = [audit_record(action="test.forgery", actor="service:test", subject_type="ledger",
                            subject_id=i, payload={"i": i}).id for i in range(n)]
    ledger()  # sealed (PostgreSQL chains at commit)
    return ids


@pytest.mark.django_db
def test_entries_the_ledger_writes_follow_the_second_implementation():
    ids = record(3)
    rows = [db_row(i) for i in ids]
    for before, row in zip(rows, rows[1:], strict=False):
        assert row["prev_hash"] == before["hash"] and row["sequence"] == before["sequence"] + 1
    for row in rows:
        assert row["digest"] == digest(row)
        assert row["hash"] == link(row["prev_hash"], row["sequence"], row["digest"])


def rewrite(entry_id: int, **columns) -> dict:
    sets = ", ".join(f"{name} = %s" for name in columns)
    tamper(f"UPDATE audit_entry SET {sets} WHERE id = %s", [*columns.values(), entry_id])
    return db_row(entry_id)


@pytest.mark.django_db
def test_rewriting_entry_n_and_patching_only_entry_n_plus_one_is_caught_at_n_plus_one():
    first, victim, following, last = record(4)
    forged = {**db_row(victim), "actor": "user:mallory"}
    forged_digest = digest(forged)
    forged_hash = link(forged["prev_hash"], forged["sequence"], forged_digest)
    rewrite(victim, actor="user:mallory", digest=forged_digest, hash=forged_hash)
    rewrite(following, prev_hash=forged_hash)

    report = verify_ledger()
    assert report.broken.entry_id == following
    assert "hash does not match" in report.broken.reason


@pytest.mark.django_db
def test_rewriting_entry_n_and_rechaining_n_plus_one_is_caught_at_n_plus_two():
    first, victim, following, last = record(4)
    forged = {**db_row(victim), "actor": "user:mallory"}
    forged["digest"] = digest(forged)
    forged["hash"] = link(forged["prev_hash"], forged["sequence"], forged["digest"])
    rewrite(victim, actor="user:mallory", digest=forged["digest"], hash=forged["hash"])
    patched = {**db_row(following), "prev_hash": forged["hash"]}
    rewrite(following, prev_hash=forged["hash"],
            hash=link(forged["hash"], patched["sequence"], patched["digest"]))

    report = verify_ledger()
    assert report.broken.entry_id == last
    assert "prev_hash" in report.broken.reason


@pytest.mark.django_db
def test_an_entry_moved_to_another_place_in_the_chain_is_caught():
    first, second, third = record(3)
    rows = {i: db_row(i) for i in (first, second, third)}
    # Give the second entry the third's sequence and link (and drop the third): the content
    # no longer matches the hash that sequence and prev_hash promise.
    tamper("DELETE FROM audit_entry WHERE id = %s", [third])
    rewrite(second, sequence=rows[third]["sequence"], prev_hash=rows[third]["prev_hash"],
            hash=rows[third]["hash"])

    report = verify_ledger()
    assert not report.ok and report.broken.entry_id == second
