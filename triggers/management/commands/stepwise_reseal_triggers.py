"""`manage.py stepwise_reseal_triggers`: re-encrypt every webhook secret, every run's secret
inputs and callback secret, under the current STEPWISE_TRIGGER_KEY, after putting the old key in
STEPWISE_TRIGGER_KEY_FALLBACKS (docs/security.md). Secrets stay the same; senders change nothing."""
from django.core.management.base import BaseCommand

from notifications.services import callbacks_reseal
from orchestrator.engine.secret_inputs import secrets_reseal
from triggers.services.config import triggers_reseal


class Command(BaseCommand):
    help = ("Re-encrypt the webhook secrets, the runs' secret inputs and their callback secrets "
            "under the current STEPWISE_TRIGGER_KEY.")

    def handle(self, *args, **options):
        count = triggers_reseal()
        self.stdout.write(f"resealed the secrets of {count} webhook trigger(s)")
        runs = secrets_reseal()
        self.stdout.write(f"resealed the secret inputs of {runs} run(s)")
        callbacks = callbacks_reseal()
        self.stdout.write(f"resealed the callback secrets of {callbacks} run(s)")
