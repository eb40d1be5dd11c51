"""`manage.py audit_checkpoint`: sign the ledger's head into the checkpoint store now.

The audit worker does this at start and then on schedule (`audit.tasks.checkpoint`); run it
by hand right after rotating the signing key, or from cron where no audit worker runs.
"""
from botocore.exceptions import BotoCoreError, ClientError
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from audit.anchoring import checkpoint_write
from audit.stores import checkpoint_store


class Command(BaseCommand):
    help = "Write a signed checkpoint of the audit ledger's head (out of the database)."

    def handle(self, *args, **options):
        store = checkpoint_store()
        try:
            checkpoint = checkpoint_write(reason="manual", store=store)
        except ImproperlyConfigured as exc:  # no signing key here
            raise CommandError(str(exc)) from exc
        except (OSError, BotoCoreError, ClientError) as exc:
            raise CommandError(f"cannot write to {store.describe()}: {exc}") from exc
        if checkpoint is None:
            self.stdout.write("the ledger is empty: nothing to anchor")
            return
        self.stdout.write(f"wrote {checkpoint.name} to {store.describe()}: sequence "
                          f"{checkpoint.sequence}, hash {checkpoint.hash}, key {checkpoint.key_id}")
