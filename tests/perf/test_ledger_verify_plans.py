"""An incremental verification reads what is new, however long the ledger behind it: on a
PostgreSQL ledger of 20,000 entries, analysed, every query the incremental verification sends
to the ledger is EXPLAINed (ANALYZE, so a LIMIT's early stop counts) and may neither scan the
table sequentially nor read more of its rows than a bound set by the few entries that are new.
A count, a MAX or an ORDER BY over the history (as the check of missing entries, the progress
total and the search for the newest prune once were) fails here, where a small ledger hides it.
"""
import json

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from audit import chain
from audit.anchoring import checkpoint_write
from audit.models import LedgerVerification
from audit.services import audit_record
from audit.verification import ledger_verification_run
from orchestrator.engine.clock import now

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif("connection.vendor != 'postgresql'",
                       reason="query plans are PostgreSQL's (EXPLAIN); SQLite plans differently"),
]

HISTORY = 20_000
NEW = 30
# Rows of the ledger one query may read: a page of new entries and a few index probes, far
# below the history.
MOST_READ = 2_000


@pytest.fixture
def verified_history():
    """HISTORY entries, chained by the database, with a signed checkpoint of their head that a
    passed verification covers (recorded, not walked: the seeded digests are not content's)."""
    with connection.cursor() as cursor:
        cursor.execute("""
            INSERT INTO audit_entry (created_at, actor, actor_kind, action, subject_type,
                subject_id, team, workflow, definition_digest, run_id, step_name, proposal_hash, model,
                prompt_version, idempotency_key, correlation_id, outcome, payload, payload_ref,
                digest, shard)
            SELECT now() - interval '1 day', 'system', 'system', 'step.completed', 'run', g::text,
                   'support', 'support', '', md5((g / 10)::text)::uuid, 's1', '', '', '', '', '', 'ok', '{}', '',
                   md5(g::text) || md5(g::text), 0
            FROM generate_series(1, %s) AS g""", [HISTORY])
    chain.seal_pending()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE audit_entry")
    checkpoint = checkpoint_write(reason="test")
    LedgerVerification.objects.create(
        requested_by_label="test", created_at=now(), state=LedgerVerification.State.PASSED,
        mode="full", from_sequence=1, through_sequence=checkpoint.sequence,
        through_hash=checkpoint.hash)
    return checkpoint


def ledger_rows_read(sql: str) -> tuple[int, list[str]]:
    """Rows of audit_entry the query's plan read (returned, or read and filtered out), and its
    scans of the table."""
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}")
        document = cursor.fetchone()[0]
    document = json.loads(document) if isinstance(document, str) else document
    read, scans, todo = 0, [], [document[0]["Plan"]]
    while todo:
        node = todo.pop()
        todo += node.get("Plans", [])
        if node.get("Relation Name") != "audit_entry":
            continue
        scans.append(f"{node['Node Type']} {node.get('Index Name', '')}".strip())
        read += (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
                 + node.get("Rows Removed by Index Recheck", 0)) * node.get("Actual Loops", 1)
    return read, scans


def test_an_incremental_verification_reads_only_the_new_entries_of_a_long_ledger(verified_history):
    with transaction.atomic():
        for i in range(NEW):
            audit_record(action="test.event", actor="service:test", subject_type="ledger",
                         subject_id=i, payload={"i": i})
    chain.seal_pending()
    verification = LedgerVerification.objects.create(requested_by_label="test", created_at=now(),
                                                     mode="incremental")

    with CaptureQueriesContext(connection) as queries:
        done = ledger_verification_run(verification_id=verification.pk)

    assert done.state == "passed" and done.mode == "incremental", done.result
    assert done.entries_checked == done.entries_total == NEW
    reads = [q["sql"] for q in queries.captured_queries
             if q["sql"].startswith("SELECT") and '"audit_entry"' in q["sql"]]
    assert reads
    for sql in reads:
        read, scans = ledger_rows_read(sql)
        assert "Seq Scan" not in scans, (scans, sql)
        assert read <= MOST_READ, (read, scans, sql)
