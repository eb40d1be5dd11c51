"""`manage.py audit_verify`: walk the ledger's hash chain and report the first broken link,
then check the ledger against its signed checkpoints.

Exit status 0 when the chain is intact, matches every checkpoint in the checkpoint store and
no checkpoint is expected and missing; 1 (CommandError) otherwise: at the first broken link,
naming the entry's sequence and id and what is wrong with it; when a checkpoint shows a
rewritten history or a truncated tail, naming the checkpoint and the sequences; when a
checkpoint the database notes as written is missing from the store, or entries older than
the checkpoint interval allows are covered by none (`audit.anchoring`).
`--allow-missing-checkpoint` accepts the last kind, with a warning. `--incremental` walks only
what follows the newest signed checkpoint an earlier verification found intact. It also warns when one of
the triggers that make the ledger append-only is missing or disabled. With `--export FILE` it
checks an export file against its manifest (and the signed checkpoint the manifest carries)
instead, without the database. The check is `audit.verification.ledger_check`, the same the
admin's *Verify ledger* runs.
"""
from pathlib import Path

from botocore.exceptions import BotoCoreError, ClientError
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from audit.export import verify_export
from audit.verification import WHAT, ledger_check


class Command(BaseCommand):
    help = "Verify the audit ledger's hash chain (or an export of it) and report the first break."

    def add_arguments(self, parser):
        parser.add_argument("--export", type=Path, help="Verify this export file (and its manifest).")
        parser.add_argument("--previous", type=Path,
                            help="With --export: the previous export's manifest, to check continuity.")
        parser.add_argument("--allow-missing-checkpoint", action="store_true",
                            help="Accept (with a warning) a signed checkpoint that is expected "
                                 "and missing, e.g. after moving the checkpoint store.")
        parser.add_argument("--incremental", action="store_true",
                            help="Walk only the entries after the newest signed checkpoint an "
                                 "earlier verification (admin, API) found intact.")

    def handle(self, *args, export=None, previous=None, allow_missing_checkpoint=False,
               incremental=False, **options):
        if export is not None:
            return self.verify_export(export, previous)
        try:
            check = ledger_check(allow_missing_checkpoint=allow_missing_checkpoint,
                                 incremental=incremental)
        except ImproperlyConfigured as exc:  # no key to check the checkpoints with
            raise CommandError(f"{WHAT}: cannot check its signed checkpoints: {exc}") from exc
        except (OSError, BotoCoreError, ClientError) as exc:
            raise CommandError(f"{WHAT}: cannot read the checkpoint store: {exc}") from exc
        for warning in check.warnings:
            self.stderr.write(f"WARNING: {warning}")
        if not check.ok:
            raise CommandError(check.message)
        self.stdout.write(check.message)

    def verify_export(self, export: Path, previous: Path | None) -> None:
        try:
            report, problems = verify_export(export, previous_manifest=previous)
        except ImproperlyConfigured as exc:  # no key to check the manifest's checkpoint
            raise CommandError(f"export {export}: cannot check its checkpoint: {exc}") from exc
        what = f"export {export}"
        if report.broken is not None:
            raise CommandError(f"{what}: BROKEN at {report.broken} "
                               f"({report.count} entries verified before it)")
        if problems:
            raise CommandError(f"{what}: " + "; ".join(problems))
        if report.count == 0:
            self.stdout.write(f"{what}: OK (empty)")
            return
        self.stdout.write(
            f"{what}: OK, {report.count} entries, sequences {report.first_sequence}.."
            f"{report.head_sequence}, head {report.head_hash}")
