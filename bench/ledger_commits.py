"""Audited commits per second against concurrent writers, the ledger in one shard and in N
(docs/benchmark.md, "The ledger's commit ceiling").

Creates a database of its own (`BENCH_LEDGER_DATABASE_URL`, default
`postgres://postgres@127.0.0.1:5432/stepwise_bench_commits`), migrates it (the seal trigger of
audit migration 0006), then runs `pgbench` with one transaction per audited commit: 4 ledger
entries of one run, in the shard the run falls in (a random one of `--shards`, as
`audit.chain.shard_of` spreads runs), sealed at COMMIT by the trigger. For each number of
writers (`--writers`, pgbench clients) it alternates one shard (every commit under one lock, as
before the partitioning) and `--shards` shards, `--rounds` times, and prints the median tps of
each. pgbench is the client so that the client's own CPU is as small as it can be: what is
measured is the database's ceiling, not Stepwise's Python. Afterwards it checks that every
shard's chain is linear (sequences 1..n, each prev_hash its predecessor's hash).

    .venv/bin/python bench/ledger_commits.py            # --writers 2 8 32 --shards 16
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make the `bench` package importable
    sys.path.insert(0, str(ROOT))

from bench.backends import database_drop, database_recreate  # noqa: E402

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/stepwise_bench_commits"

SCRIPT = """\\set shard random(0, {last})
BEGIN;
INSERT INTO audit_entry (created_at, actor, actor_kind, action, subject_type, subject_id, team,
    workflow, definition_digest, step_name, proposal_hash, model, prompt_version, idempotency_key,
    correlation_id, outcome, payload, payload_ref, digest, shard)
SELECT now(), 'service:bench', 'service', 'bench.commit', 'run', :client_id::text, '', '', '', '',
    '', '', '', '', '', '', '{{}}', '', md5(random()::text) || md5(random()::text), :shard
FROM generate_series(1, 4);
END;
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, nargs="+", default=[2, 8, 32])
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--seconds", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    options = parser.parse_args()
    url = os.environ.get("BENCH_LEDGER_DATABASE_URL", DEFAULT_URL)
    database_recreate(url)
    try:
        _migrate(url)
        results = _measure(url, options)
        _check_linear(url)
    finally:
        database_drop(url)
    print(f"\naudited commits/s (4 entries each), median of {options.rounds} x {options.seconds} s:")
    print(f"| writers | 1 shard | {options.shards} shards |")
    print("|---|---|---|")
    for writers in options.writers:
        print(f"| {writers} | {results[(writers, 1)]:,.0f} | {results[(writers, options.shards)]:,.0f} |")


def _migrate(url: str) -> None:
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "orchestrator.settings"}
    subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "audit", "--verbosity", "0"],
                   check=True, cwd=ROOT, env=env)


def _measure(url: str, options) -> dict[tuple[int, int], float]:
    scripts = tempfile.TemporaryDirectory(prefix="stepwise-bench-commits-")
    files = {}
    for shards in (1, options.shards):
        files[shards] = Path(scripts.name, f"commit-{shards}.sql")
        files[shards].write_text(SCRIPT.format(last=shards - 1))
    samples: dict[tuple[int, int], list[float]] = {}
    for _round in range(options.rounds):
        for writers in options.writers:
            for shards in (1, options.shards):
                tps = _pgbench(url, files[shards], writers, options.seconds)
                samples.setdefault((writers, shards), []).append(tps)
                print(f"writers {writers:3d}, shards {shards:3d}: {tps:,.0f} commits/s", flush=True)
    scripts.cleanup()
    return {key: statistics.median(values) for key, values in samples.items()}


def _pgbench(url: str, script: Path, writers: int, seconds: int) -> float:
    done = subprocess.run(["pgbench", "-n", "-f", str(script), "-c", str(writers),
                           "-j", str(min(writers, os.cpu_count() or 1)), "-T", str(seconds), url],
                          check=True, capture_output=True, text=True)
    found = re.search(r"tps = ([0-9.]+)", done.stdout)
    if found is None:
        raise RuntimeError(f"pgbench printed no tps:\n{done.stdout}\n{done.stderr}")
    return float(found.group(1))


def _check_linear(url: str) -> None:
    import psycopg
    with psycopg.connect(url) as connection:
        broken = connection.execute(
            "SELECT count(*) FROM audit_entry e LEFT JOIN audit_entry p"
            " ON p.shard = e.shard AND p.sequence = e.sequence - 1"
            " WHERE e.sequence IS NULL OR (e.sequence > 1 AND p.hash IS DISTINCT FROM e.prev_hash)"
        ).fetchone()[0]
        shards, entries, heads = connection.execute(
            "SELECT count(*), (SELECT count(*) FROM audit_entry), coalesce(sum(top), 0) FROM"
            " (SELECT max(sequence) AS top FROM audit_entry GROUP BY shard) tops").fetchone()
    if broken or entries != heads:
        raise SystemExit(f"the chains are not linear: {broken} broken links, {entries} entries, "
                         f"heads summing to {heads}")
    print(f"checked: {entries:,} entries in {shards} shards, every chain linear")


if __name__ == "__main__":
    main()
