"""`manage.py stepwise_soak --minutes N --seed S`: the soak (soak/, docs/failure-semantics.md).

It starts a private PostgreSQL cluster in a temporary directory, then runs the soak's driver
as a child process of its own configured for that cluster (`--driver`), and removes the
cluster afterwards (`--keep` keeps the directory: logs, the database). It prints the totals as
JSON and as a table, writes them to `--report` (default var/soak-totals.json), and exits 1 when
any invariant was violated (or with `--faults F`, when fewer than F faults were injected).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

# The soak's remote listens on loopback: allowed, as an operator would (docs/egress.md).
EGRESS = json.dumps({"default": {"allow_networks": ["127.0.0.0/8"], "ports": "*"}})


class Command(BaseCommand):
    help = "Run a mixed workload under random faults on a private PostgreSQL + Redis; check every invariant."

    def add_arguments(self, parser):
        parser.add_argument("--minutes", type=float, default=5, help="how long faults are injected")
        parser.add_argument("--seed", type=int, default=1)
        parser.add_argument("--faults", type=int, default=0, help="fail unless at least this many faults happened")
        parser.add_argument("--report", default=str(Path(settings.VAR_DIR) / "soak-totals.json"))
        parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
        parser.add_argument("--driver", help=argparse_hidden())

    def handle(self, *args, **options):
        if options["driver"]:
            return self._drive(options)
        from soak.cluster import Postgres, free_port, missing_binaries

        missing = missing_binaries()
        if missing:
            raise CommandError(f"the soak needs its own PostgreSQL and Redis servers: missing {missing}")
        root = Path(tempfile.mkdtemp(prefix="stepwise-soak-"))
        pg = Postgres(root)
        redis_port = free_port()
        try:
            pg.init()
            # Every URL the driver and its processes use names the soak's own servers: never a
            # shared one, whatever this shell's environment says.
            redis_url = f"redis://127.0.0.1:{redis_port}/0"
            env = {**os.environ, "DATABASE_URL": pg.url, "STEPWISE_VAR_DIR": str(root / "var"),
                   "CELERY_BROKER_URL": redis_url, "REDIS_URL": redis_url,
                   "PYTHONUNBUFFERED": "1", "STEPWISE_EGRESS": EGRESS}
            env.pop("STEPWISE_SQLITE_PATH", None)
            driver = subprocess.run(
                [sys.executable, "manage.py", "stepwise_soak", "--driver", f"{root}:{pg.port}:{redis_port}",
                 "--minutes", str(options["minutes"]), "--seed", str(options["seed"]),
                 "--faults", str(options["faults"]), "--report", options["report"]],
                cwd=settings.BASE_DIR, env=env)
        finally:
            pg.stop()
            if options["keep"]:
                self.stdout.write(f"soak directory kept: {root}")
            else:
                shutil.rmtree(root, ignore_errors=True)
        if driver.returncode:
            raise CommandError("the soak found violations or could not run (see above)")

    def _drive(self, options) -> None:
        from soak.driver import Soak, table

        root, pg_port, redis_port = options["driver"].rsplit(":", 2)
        soak = Soak(minutes=options["minutes"], seed=options["seed"], root=Path(root),
                    pg_port=int(pg_port), redis_port=int(redis_port),
                    log=lambda text: self.stdout.write(text))
        report = soak.run()
        Path(options["report"]).parent.mkdir(parents=True, exist_ok=True)
        Path(options["report"]).write_text(json.dumps(report, indent=2))
        self.stdout.write(json.dumps(report))
        self.stdout.write(table(report))
        if report["violations"] or not report["settled"]:
            raise CommandError(f"{report['violations']} violation(s): {report['violation_list']}")
        if report["faults"] < options["faults"]:
            raise CommandError(f"only {report['faults']} faults were injected, {options['faults']} wanted")


def argparse_hidden():
    import argparse

    return argparse.SUPPRESS
