"""The scale-history phase (issue 50): a history of N finished runs written straight into
PostgreSQL (bench/history.py), then p50/p99 of every list and page a person reads over it
(the API's lists, first and deep pages, the costs report, the admin's changelists, the
operations page) and of the reaper's sweep and the alerts' time check.

Run by `python bench/run.py --scale-history N` on PostgreSQL; prints a table and writes JSON.
Requests go through Django's test client in this process (no HTTP server): what is measured is
the view, its queries and its template, not a socket.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from pathlib import Path

BATCH = 100_000
# A million runs spread over about a year, so that the costs report's default 30 days hold a
# twelfth of the history, as a deployment's would, rather than all of it.
GAP_S = 30.0


def quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, required=True)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--gap", type=float, default=GAP_S,
                        help="seconds between two seeded runs' creation (default: a year's history)")
    parser.add_argument("--phase", choices=("all", "seed", "measure"), default="all",
                        help="seed only, or measure a history seeded before (default: both)")
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator.settings")
    import django
    django.setup()
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction
    from django.test import Client
    from django.utils import timezone

    from alerts.detection import alerts_check_time
    from bench.history import Shape, seed
    from orchestrator.engine.services.reaper import reap
    from orchestrator.engine.services.workflows import workflow_save
    from orchestrator.models import Role, Run, Team, TeamMembership
    from orchestrator.web.api.pagination import encode_cursor

    assert connection.vendor == "postgresql", "the scale-history phase needs PostgreSQL"
    user_model = get_user_model()
    if args.phase == "measure":
        admin = user_model.objects.get(username="bench-admin")
        member = user_model.objects.get(username="bench-member")
        seeding_s = None
    else:
        admin = user_model.objects.create_superuser("bench-admin", "admin@example.com", "x")
        member = user_model.objects.create_user("bench-member", "member@example.com", "x")
        team = Team.objects.create(slug="support", name="Support")
        TeamMembership.objects.create(team=team, user=member, role=Role.OWNER)
        import yaml
        definition = yaml.safe_load((Path(__file__).parent.parent / "examples" / "support.yaml")
                                    .read_text())
        version, _ = workflow_save(team=team, definition=definition, actor=member)

        started = time.monotonic()
        done = 0
        while done < args.runs:
            size = min(BATCH, args.runs - done)
            with transaction.atomic(), connection.cursor() as cursor:
                seed(cursor, Shape(runs=size, seconds_between=args.gap), team_id=team.id,
                     version_id=version.id, user_id=member.id, newer=args.runs - done - size)
            done += size
            print(f"seeded {done:,} runs in {time.monotonic() - started:.0f}s", flush=True)
        seeding_s = time.monotonic() - started
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE")
        if args.phase == "seed":
            print(f"seeded {args.runs:,} runs in {seeding_s:.0f}s", flush=True)
            return 0
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_database_size(current_database())")
        db_bytes = cursor.fetchone()[0]
        counts = {}
        for table in ("orchestrator_run", "orchestrator_steprun", "orchestrator_event",
                      "audit_entry", "approvals_approvalrequest", "orchestrator_deadletter"):
            cursor.execute(f"SELECT reltuples::bigint FROM pg_class WHERE relname = '{table}'")
            counts[table] = cursor.fetchone()[0]

    middle = Run.objects.order_by("-created_at", "-id")[args.runs // 2:args.runs // 2 + 1].get()
    deep = encode_cursor({"d": "n", "k": [middle.created_at.isoformat(), str(middle.pk)]})
    yesterday = (timezone.localtime() - timedelta(days=1)).date()
    api, site = Client(HTTP_HOST="127.0.0.1"), Client(HTTP_HOST="127.0.0.1")
    api.force_login(member)
    site.force_login(admin)
    pages = [
        ("API runs, first page", api, "/api/v1/runs/?limit=50"),
        ("API runs, a page in the middle", api, f"/api/v1/runs/?limit=50&cursor={deep}"),
        ("API runs ?state=waiting", api, "/api/v1/runs/?state=waiting&limit=50"),
        ("API approvals ?state=pending", api, "/api/v1/approvals/?state=pending&limit=50"),
        ("API approvals", api, "/api/v1/approvals/?limit=50"),
        ("API input tasks ?state=open", api, "/api/v1/input-tasks/?state=open&limit=50"),
        ("API dead letters ?status=open", api, "/api/v1/dead-letters/?status=open&limit=50"),
        ("API dead letters", api, "/api/v1/dead-letters/?limit=50"),
        ("API costs by day (30 days)", api, "/api/v1/costs/?group_by=day"),
        ("API costs by model (30 days)", api, "/api/v1/costs/?group_by=model"),
        ("API costs by run (2 days)", api, f"/api/v1/costs/?group_by=run&from={yesterday}"),
        ("admin runs", site, "/admin/orchestrator/run/"),
        ("admin steps", site, "/admin/orchestrator/steprun/"),
        ("admin events", site, "/admin/orchestrator/event/"),
        ("admin dead letters", site, "/admin/orchestrator/deadletter/"),
        ("admin approvals (pending)", site, "/admin/approvals/approvalrequest/"),
        ("admin approvals (all)", site, "/admin/approvals/approvalrequest/?state=all"),
        ("admin alerts", site, "/admin/alerts/alert/"),
        ("admin ledger", site, "/admin/audit/auditentry/"),
        ("admin costs", site, "/admin/budgets/costreport/"),
        ("operations page", site, "/admin/orchestrator/run/operations/"),
    ]
    # Loaded as a web process loads it: what is loaded by then is frozen out of the collector's
    # full passes (orchestrator/asgi.py).
    import orchestrator.asgi  # noqa: F401
    results = []
    for name, client, url in pages:
        # The first request is reported apart: it pays what is done once (the costs report
        # writing the totals of the days it covers) and the process's first compilations.
        begin = time.perf_counter()
        client.get(url)
        first = (time.perf_counter() - begin) * 1000
        samples, status = [], None
        for _ in range(args.requests):
            begin = time.perf_counter()
            response = client.get(url)
            samples.append((time.perf_counter() - begin) * 1000)
            status = response.status_code
        results.append({"page": name, "url": url, "status": status, "first_ms": first,
                        "p50_ms": quantile(samples, 0.5), "p99_ms": quantile(samples, 0.99)})
        print(f"{name:36} {status}  first {first:8.1f} ms  p50 {results[-1]['p50_ms']:8.1f} ms  "
              f"p99 {results[-1]['p99_ms']:8.1f} ms", flush=True)
    for name, call in (("reaper sweep (reap)", reap), ("alerts time check", alerts_check_time)):
        samples = []
        for _ in range(max(5, args.requests // 3)):
            begin = time.perf_counter()
            call()
            samples.append((time.perf_counter() - begin) * 1000)
        results.append({"page": name, "url": "", "status": None,
                        "p50_ms": quantile(samples, 0.5), "p99_ms": quantile(samples, 0.99)})
        print(f"{name:36}      p50 {results[-1]['p50_ms']:8.1f} ms  "
              f"p99 {results[-1]['p99_ms']:8.1f} ms", flush=True)
    args.out.write_text(json.dumps({"runs": args.runs, "seeding_s": seeding_s,
                                    "database_bytes": db_bytes, "rows": counts,
                                    "requests": args.requests, "results": results}, indent=2))
    print(f"seeded {args.runs:,} runs in {seeding_s or 0:.0f}s; database {db_bytes / 2**30:.2f} GiB; "
          f"rows {counts}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
