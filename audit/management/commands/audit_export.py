"""`manage.py audit_export --from ... --to ... [--format jsonl|csv] [--output FILE]`.

Writes the ledger entries of a time range and a manifest (`FILE.manifest.json`) with the chain
head and a signed checkpoint of it (so it needs the signing key, AUDIT_SIGNING_KEY_FILE), so
the export can be verified offline: `manage.py audit_verify --export FILE`.
"""
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from audit.export import FORMATS, export_range
from orchestrator.engine.clock import now


def _when(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError as exc:
        raise CommandError(f"not an ISO 8601 date or time: {text!r}") from exc
    return value if timezone.is_aware(value) else timezone.make_aware(value, UTC)


class Command(BaseCommand):
    help = "Export audit ledger entries of a time range to JSON Lines or CSV, with a manifest."

    def add_arguments(self, parser):
        parser.add_argument("--from", dest="start", required=True, help="ISO date/time (inclusive)")
        parser.add_argument("--to", dest="end", help="ISO date/time (exclusive; default: now)")
        parser.add_argument("--format", choices=FORMATS, default="jsonl")
        parser.add_argument("--output", type=Path,
                            help="File to write (default: AUDIT_EXPORT_DIR/audit-<from>-<to>.<format>)")

    def handle(self, *args, start, end=None, format, output=None, **options):
        start_at, end_at = _when(start), _when(end) if end else now()
        if end_at <= start_at:
            raise CommandError("--to must be after --from")
        if output is None:
            stamp = f"{start_at:%Y%m%dT%H%M%S}-{end_at:%Y%m%dT%H%M%S}"
            output = Path(settings.AUDIT_EXPORT_DIR) / f"audit-{stamp}.{format}"
        try:
            result = export_range(start=start_at, end=end_at, fmt=format, path=output)
        except ImproperlyConfigured as exc:  # no signing key for the manifest's checkpoint
            raise CommandError(str(exc)) from exc
        manifest = result.manifest
        self.stdout.write(
            f"wrote {manifest['count']} entries (sequences {manifest['first_sequence']}.."
            f"{manifest['last_sequence']}) to {result.path}\nmanifest: {result.manifest_path}")
