"""`manage.py audit_checkpoint`: sign the ledger's head into AUDIT_CHECKPOINT_DIR now.

Beat does this every AUDIT_CHECKPOINT_INTERVAL_S (`audit.tasks.checkpoint`); run it by hand
right after rotating the signing key, or from cron where beat does not run.
"""
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from audit.anchoring import checkpoint_write


class Command(BaseCommand):
    help = "Write a signed checkpoint of the audit ledger's head (out of the database)."

    def handle(self, *args, **options):
        try:
            checkpoint = checkpoint_write(reason="manual")
        except ImproperlyConfigured as exc:  # no signing key here
            raise CommandError(str(exc)) from exc
        if checkpoint is None:
            self.stdout.write("the ledger is empty: nothing to anchor")
            return
        self.stdout.write(f"wrote {checkpoint.path}: sequence {checkpoint.sequence}, "
                          f"hash {checkpoint.hash}, key {checkpoint.key_id}")
