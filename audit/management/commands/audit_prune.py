"""`manage.py audit_prune [--days N] [--dry-run]`: apply the ledger's retention policy.

Deletes the entries older than N days (default AUDIT_RETENTION_DAYS; unset means keep forever)
as an audited operation: an `audit.pruned` checkpoint entry records what was removed and the
hash the remaining chain continues from, so `audit_verify` still passes afterwards. What it
deletes is covered by a signed checkpoint first, and exported to the archive storage first when
one is configured (AUDIT_ARCHIVE_DIR, AUDIT_ARCHIVE_S3_BUCKET; `audit.services.audit_prune`).
"""
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from audit.services import audit_prune, retention_cutoff


class Command(BaseCommand):
    help = "Delete audit entries older than the retention period, leaving a verifiable checkpoint."

    def add_arguments(self, parser):
        parser.add_argument("--days", type=int, help="Keep this many days (default: AUDIT_RETENTION_DAYS).")
        parser.add_argument("--dry-run", action="store_true", help="Only say what would be deleted.")
        parser.add_argument("--actor", default="service:audit_prune",
                            help='Who prunes, as recorded in the checkpoint (e.g. "user:alice").')

    def handle(self, *args, days=None, dry_run=False, actor="service:audit_prune", **options):
        if days is None and getattr(settings, "AUDIT_RETENTION_DAYS", None) is None:
            raise CommandError("retention is unlimited (AUDIT_RETENTION_DAYS is not set); pass --days")
        if days is not None and days < 1:
            raise CommandError("--days must be at least 1")
        cutoff = retention_cutoff(days)
        result = audit_prune(before=cutoff, actor=actor, dry_run=dry_run)
        if not result.shards:
            self.stdout.write(f"nothing to prune before {cutoff:%Y-%m-%d %H:%M:%S}")
            return
        where = ", ".join(f"shard {shard} through sequence {part.through}"
                          for shard, part in sorted(result.shards.items()))
        if dry_run:
            self.stdout.write(f"would delete {result.deleted} entries ({where})")
        else:
            self.stdout.write(f"deleted {result.deleted} entries ({where}); checkpoint entry "
                              f"{result.checkpoint.id}"
                              + (f"; archived as {result.archive}" if result.archive else ""))
