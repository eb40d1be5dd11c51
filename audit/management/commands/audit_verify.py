"""`manage.py audit_verify`: walk the ledger's hash chain and report the first broken link.

Exit status 0 when the chain is intact, 1 (CommandError) at the first broken link, naming the
entry's sequence and id and what is wrong with it. It also warns when one of the triggers that
make the ledger append-only is missing or disabled. With `--export FILE` it checks an export
file against its manifest instead, offline, without reading the database.
"""
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from audit.chain import verify_ledger
from audit.export import verify_export
from audit.triggers import missing_guards


class Command(BaseCommand):
    help = "Verify the audit ledger's hash chain (or an export of it) and report the first break."

    def add_arguments(self, parser):
        parser.add_argument("--export", type=Path, help="Verify this export file (and its manifest).")
        parser.add_argument("--previous", type=Path,
                            help="With --export: the previous export's manifest, to check continuity.")

    def handle(self, *args, export=None, previous=None, **options):
        if export is not None:
            report, problems = verify_export(export, previous_manifest=previous)
            what = f"export {export}"
        else:
            report, problems = verify_ledger(), []
            what = "audit ledger"
            for name in missing_guards():
                self.stderr.write(f"WARNING: trigger {name} is missing or disabled: the database "
                                  "no longer refuses changes to the ledger")
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
