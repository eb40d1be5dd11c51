"""`manage.py audit_verify`: walk the ledger's hash chain and report the first broken link,
then check the ledger against its signed checkpoints.

Exit status 0 when the chain is intact and matches every checkpoint in AUDIT_CHECKPOINT_DIR,
1 (CommandError) otherwise: at the first broken link, naming the entry's sequence and id and
what is wrong with it; or when a checkpoint shows a rewritten history or a truncated tail,
naming the checkpoint and the sequences (`audit.anchoring`). It also warns when one of the
triggers that make the ledger append-only is missing or disabled, and when there is no
checkpoint to compare with. With `--export FILE` it checks an export file against its
manifest (and the signed checkpoint the manifest carries) instead, without the database.
"""
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from audit.anchoring import checkpoint_dir, ledger_anchor_check
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
            try:
                report, problems = verify_export(export, previous_manifest=previous)
            except ImproperlyConfigured as exc:  # no key to check the manifest's checkpoint
                raise CommandError(f"export {export}: cannot check its checkpoint: {exc}") from exc
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
        anchored = ""
        if export is None:
            try:
                anchor = ledger_anchor_check(report)
            except ImproperlyConfigured as exc:  # no key to check the checkpoints with
                raise CommandError(f"{what}: cannot check its signed checkpoints: {exc}") from exc
            if not anchor.ok:
                raise CommandError(f"{what}: does not match its signed checkpoints: "
                                   + "; ".join(anchor.problems))
            if anchor.latest is None:
                self.stderr.write(
                    f"WARNING: no signed checkpoint of the ledger in {checkpoint_dir()}: a "
                    "rewritten history or a truncated tail cannot be detected (docs/security.md)")
            else:
                newer = (report.head_sequence or 0) - anchor.latest.sequence
                anchored = (f"; matches {anchor.checked} signed checkpoint(s), the newest at "
                            f"sequence {anchor.latest.sequence}: {anchor.latest.describe()}"
                            + (f" ({newer} newer entries not anchored yet)" if newer else ""))
        if report.count == 0:
            self.stdout.write(f"{what}: OK (empty){anchored}")
            return
        self.stdout.write(
            f"{what}: OK, {report.count} entries, sequences {report.first_sequence}.."
            f"{report.head_sequence}, head {report.head_hash}{anchored}")
