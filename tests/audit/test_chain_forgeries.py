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

from audit.chain import Break, content_digest, link_hash, verify_ledger, verify_rows
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


# --- what a report says: every field, and the reason word for word -------------------------

CONTENT_EDITED = "the entry's content does not match its digest (it was edited)"
HASH_WRONG = "the entry's hash does not match prev_hash, sequence and digest"
PREV_WRONG = "prev_hash does not match the previous entry's hash (an entry was removed or replaced)"


def without(rows: list[dict], sequence: int) -> list[dict]:
    return [r for r in rows if r["sequence"] != sequence]


def with_changes(rows: list[dict], at: int, **changes) -> list[dict]:
    """`rows` with the entry of sequence `at` changed (and nothing recomputed)."""
    return [{**r, **changes} if r["sequence"] == at else r for r in rows]


def stored_report_cases():
    """(rows, anchor, start, expected report fields, expected break or None): every row of the
    stored chain and its forgeries are built above, without audit.chain."""
    rows, h = stored_chain(), STORED_HASHES
    rehashed = forge(rows, "entry rewritten and rehashed")
    return {
        "intact": (rows, GENESIS, 1, (4, 1, 4, h[3]), None),
        "nothing to walk": ([], GENESIS, 1, (0, None, None, None), None),
        "a suffix from its anchor": (rows[2:], h[1], 3, (2, 3, 4, h[3]), None),
        "first entry edited": (with_changes(rows, 1, actor="user:mallory"),
                               GENESIS, 1, (0, None, None, None), (1, 101, CONTENT_EDITED)),
        "second entry edited": (forge(rows, "entry rewritten"), GENESIS, 1, (1, 1, 1, h[0]),
                                (2, 102, CONTENT_EDITED)),
        "digest recomputed": (forge(rows, "entry rewritten with its digest"), GENESIS, 1,
                              (1, 1, 1, h[0]), (2, 102, HASH_WRONG)),
        "rehashed, next not patched": (rehashed, GENESIS, 1, (2, 1, 2, rehashed[1]["hash"]),
                                       (3, 103, PREV_WRONG)),
        "wrong anchor": (rows, "1" * 64, 1, (0, None, None, None), (1, 101, PREV_WRONG)),
        "an entry missing": (without(rows, 2), GENESIS, 1, (1, 1, 1, h[0]),
                             (3, 103, "expected sequence 2: entries are missing")),
        "a sequence repeated": (with_changes(rows, 3, sequence=2), GENESIS, 1, (2, 1, 2, h[1]),
                                (2, 103, "expected sequence 3, found 2")),
        "no sequence": (with_changes(rows, 3, sequence=None), GENESIS, 1, (2, 1, 2, h[1]),
                        (3, 103, "expected sequence 3, found None")),
        "a text sequence": (with_changes(rows, 2, sequence="2"), GENESIS, 1, (1, 1, 1, h[0]),
                            (2, 102, "expected sequence 2, found 2")),
        "an exported row without id": ([{k: v for k, v in r.items() if k != "id"} for r in
                                        forge(rows, "entry rewritten")], GENESIS, 1, (1, 1, 1, h[0]),
                                       (2, None, CONTENT_EDITED)),
    }


@pytest.mark.parametrize("case", list(stored_report_cases()))
def test_a_report_says_how_far_the_walk_got_and_where_and_why_it_stopped(case):
    rows, anchor, start, fields, broken = stored_report_cases()[case]

    report = verify_rows(rows, anchor=anchor, start=start)

    assert (report.count, report.first_sequence, report.head_sequence, report.head_hash) == fields
    if broken is None:
        assert report.ok and report.broken is None
    else:
        assert not report.ok
        assert (report.broken.sequence, report.broken.entry_id, report.broken.reason) == broken


@pytest.mark.parametrize("sequence, entry_id, text", [
    (3, 7, "sequence 3 (entry id 7): why"),
    (0, 0, "sequence 0 (entry id 0): why"),
    (None, 7, "the ledger (entry id 7): why"),
    (3, None, "sequence 3: why"),
    (None, None, "the ledger: why"),
])
def test_a_break_names_the_sequence_and_the_entry_it_knows(sequence, entry_id, text):
    assert str(Break(sequence, entry_id, "why")) == text
