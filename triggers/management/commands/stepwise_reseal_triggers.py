"""`manage.py stepwise_reseal_triggers`: re-encrypt every webhook secret, and every run's secret
inputs, under the current STEPWISE_TRIGGER_KEY, after putting the old key in
STEPWISE_TRIGGER_KEY_FALLBACKS (docs/security.md). Secrets stay the same; senders change nothing."""
from django.core.management.base import BaseCommand

from orchestrator.secret_inputs import secrets_reseal
from triggers.services.config import triggers_reseal


class Command(BaseCommand):
    help = ("Re-encrypt the webhook secrets and the runs' secret inputs under the current "
            "STEPWISE_TRIGGER_KEY.")

    def handle(self, *args, **options):
        count = triggers_reseal()
        self.stdout.write(f"resealed the secrets of {count} webhook trigger(s)")
        runs = secrets_reseal()
        self.stdout.write(f"resealed the secret inputs of {runs} run(s)")
