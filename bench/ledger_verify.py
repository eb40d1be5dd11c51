"""Verification of a large ledger: the whole chain, then only what is new (docs/benchmark.md,
"Verifying a large ledger").

Seeds N chained entries directly into PostgreSQL (COPY, the triggers off for the seeding
session only, every digest and hash computed with `audit.chain`'s formulas), signs a checkpoint
of the head, runs a full verification as the audit worker runs it (`ledger_verification_run`),
appends M more entries the same way, then runs an incremental verification. Prints the time
of each and how many entries each walked. Runs against a database of its own
(`BENCH_LEDGER_DATABASE_URL`, default `postgres://postgres@127.0.0.1:5432/stepwise_bench_ledger`),
created and dropped here, with the signing key and checkpoints in a temporary directory.

    .venv/bin/python bench/ledger_verify.py --entries 1000000 --new 1000
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make the `bench` package importable
    sys.path.insert(0, str(ROOT))

from bench.backends import database_drop, database_recreate  # noqa: E402

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/stepwise_bench_ledger"
BATCH = 50_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--new", type=int, default=1_000)
    options = parser.parse_args()
    url = os.environ.get("BENCH_LEDGER_DATABASE_URL", DEFAULT_URL)
    scratch = tempfile.TemporaryDirectory(prefix="stepwise-bench-ledger-")
    os.environ.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE="orchestrator.settings",
                      AUDIT_SIGNING_KEY_FILE=str(Path(scratch.name, "signing-key.pem")),
                      AUDIT_CHECKPOINT_DIR=str(Path(scratch.name, "checkpoints")),
                      AUDIT_CHECKPOINT_GRACE_S="1000000000")
    database_recreate(url)
    try:
        _measure(options.entries, options.new)
    finally:
        from django.db import connections
        connections.close_all()
        database_drop(url)
        scratch.cleanup()


def _seed(first: int, count: int, prev_hash: str) -> str:
    """Append `count` chained entries from sequence `first`; returns the new head's hash."""
    from django.db import connection

    from audit import chain
    raw = connection.connection
    columns = [*chain.CONTENT_FIELDS, *chain.CHAIN_FIELDS]
    started = datetime.now(UTC) - timedelta(seconds=count)
    with raw.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")  # no trigger while seeding
        for start in range(0, count, BATCH):
            rows = []
            for offset in range(start, min(count, start + BATCH)):
                sequence = first + offset
                created = started + timedelta(microseconds=offset * 1000)
                content = {
                    "created_at": chain.timestamp_text(created), "actor": "worker:bench",
                    "actor_kind": "worker", "action": "step.completed", "subject_type": "step",
                    "subject_id": str(sequence), "team": "bench", "workflow": "chain",
                    "workflow_version": 1, "definition_digest": "0" * 64, "run_id": None,
                    "step_name": "s1", "event_id": sequence, "proposal_hash": "", "model": "",
                    "prompt_version": "", "idempotency_key": "", "correlation_id": "",
                    "outcome": "completed", "payload": f'{{"output":{{"n":{sequence}}}}}',
                    "payload_ref": ""}
                digest = chain.content_digest(content)
                hash_ = chain.link_hash(prev_hash, sequence, digest)
                rows.append({**content, "created_at": created, "sequence": sequence,
                             "prev_hash": prev_hash, "hash": hash_, "digest": digest, "shard": 0})
                prev_hash = hash_
            with cursor.copy(f"COPY audit_entry ({', '.join(columns)}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row([row[name] for name in columns])
        cursor.execute("SET session_replication_role = origin")
    raw.commit()
    with raw.cursor() as cursor:
        cursor.execute("ANALYZE audit_entry")
    raw.commit()
    return prev_hash


def _verify(mode: str) -> tuple[float, object]:
    from audit.models import LedgerVerification
    from audit.verification import ledger_verification_run
    from orchestrator.engine.clock import now
    row = LedgerVerification.objects.create(requested_by_label="bench", created_at=now(), mode=mode)
    started = time.perf_counter()
    done = ledger_verification_run(verification_id=row.pk)
    return time.perf_counter() - started, done


def _measure(entries: int, new: int) -> None:
    import django
    django.setup()
    from django.core.management import call_command

    from audit.anchoring import checkpoint_write
    from audit.models import GENESIS_HASH
    call_command("migrate", verbosity=0)

    started = time.perf_counter()
    head = _seed(1, entries, GENESIS_HASH)
    print(f"seeded {entries:,} entries in {time.perf_counter() - started:.1f} s")
    checkpoint_write(reason="bench")

    elapsed, full = _verify("full")
    assert full.state == "passed", full.result
    print(f"full verification: {full.entries_checked:,} entries in {elapsed:.2f} s "
          f"({full.entries_checked / elapsed:,.0f} entries/s)")

    _seed(entries + 1, new, head)
    print(f"appended {new:,} entries")
    elapsed, incremental = _verify("incremental")
    assert incremental.state == "passed" and incremental.mode == "incremental", incremental.result
    print(f"incremental verification: {incremental.entries_checked:,} new entries of "
          f"{entries + new:,} in {elapsed:.2f} s")


if __name__ == "__main__":
    main()
