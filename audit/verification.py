"""Verifying the whole ledger: the one check `manage.py audit_verify` and the admin's
*Verify ledger* both run; and the auditor's jobs, a verification and an export.

`ledger_check` walks the chain (`audit.chain`), then compares it with the signed checkpoints
(`audit.anchoring`): it passes only when the chain is intact, matches every checkpoint, and
no checkpoint is expected and missing — unless the caller accepts a missing one, which is
then a warning.

An auditor asks for a verification (`ledger_verification_request`: auditors and superusers,
checked here); the task `audit.tasks.verify` runs it on the `audit` queue, where the signing
key is (`ledger_verification_run`), and keeps its row up to date as it goes, so the admin can
show its progress, its result and when it ran.

An export (`ledger_export_request`, the same people) is written by `audit.tasks.export` on the
`audit` queue as `manage.py audit_export` writes one — the whole ledger and its manifest with
a signed checkpoint — into the storage every process shares (`STORAGES["artifacts"]`, under
`audit-exports/`), from where `ledger_export_open` hands it to an auditor.

This module reads the ledger; the only entries it appends are the requests'.
"""
from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from botocore.exceptions import BotoCoreError, ClientError
from celery import current_app
from django.core.exceptions import ImproperlyConfigured
from django.core.files import File
from django.core.files.storage import storages
from django.db import transaction

from orchestrator.engine.authz import label
from orchestrator.engine.clock import now
from orchestrator.engine.errors import Forbidden, NotAllowed

from .access import can_read_ledger
from .anchoring import ledger_anchor_check
from .chain import Report, verify_ledger
from .export import FORMATS, export_range
from .models import AuditEntry, LedgerExport, LedgerVerification, SubjectType
from .services import audit_record
from .triggers import missing_guards

WHAT = "audit ledger"
ACCEPT_FLAG = "--allow-missing-checkpoint"


@dataclass(frozen=True)
class LedgerCheck:
    ok: bool
    message: str                      # one line: the result, or why it failed
    report: Report
    warnings: list[str] = field(default_factory=list)


def ledger_check(*, allow_missing_checkpoint: bool = False,
                 progress: Callable[[int], None] | None = None,
                 stage: Callable[[str], None] | None = None) -> LedgerCheck:
    """Verify the ledger's chain and its anchoring. `progress(entries read)` and
    `stage(description)` report how far it got.

    Raises ImproperlyConfigured when there is no key to check the checkpoints with, and the
    checkpoint store's errors (OSError, botocore's) when it cannot be read.
    """
    warnings = [f"trigger {name} is missing or disabled: the database no longer refuses "
                "changes to the ledger" for name in missing_guards()]
    if stage:
        stage("walking the chain")
    report = verify_ledger(progress=progress)
    if report.broken is not None:
        return LedgerCheck(False, f"{WHAT}: BROKEN at {report.broken} "
                                  f"({report.count} entries verified before it)", report, warnings)
    if stage:
        stage("comparing with the signed checkpoints")
    anchor = ledger_anchor_check(report)
    if anchor.problems:
        return LedgerCheck(False, f"{WHAT}: does not match its signed checkpoints: "
                           + "; ".join(anchor.problems), report, warnings)
    if anchor.missing and not allow_missing_checkpoint:
        return LedgerCheck(False, f"{WHAT}: a signed checkpoint is expected and missing: "
                           + "; ".join(anchor.missing)
                           + f" ({ACCEPT_FLAG} accepts this)", report, warnings)
    warnings += [f"accepted ({ACCEPT_FLAG}): {text}" for text in anchor.missing]
    anchored = ""
    if anchor.latest is None:
        if report.count and not anchor.missing:
            warnings.append(f"no signed checkpoint of the ledger in {anchor.store} yet: a rewritten "
                            "history or a truncated tail cannot be detected until one is written")
    else:
        newer = (report.head_sequence or 0) - anchor.latest.sequence
        anchored = (f"; matches {anchor.checked} signed checkpoint(s), the newest at "
                    f"sequence {anchor.latest.sequence}: {anchor.latest.describe()}"
                    + (f" ({newer} newer entries not anchored yet)" if newer else ""))
    if report.count == 0:
        return LedgerCheck(True, f"{WHAT}: OK (empty){anchored}", report, warnings)
    return LedgerCheck(True, f"{WHAT}: OK, {report.count} entries, sequences "
                             f"{report.first_sequence}..{report.head_sequence}, head "
                             f"{report.head_hash}{anchored}", report, warnings)


# --- the auditor's verification job -----------------------------------------------------------


def ledger_verification_request(*, actor, allow_missing_checkpoint: bool = False) -> LedgerVerification:
    """Ask for a verification of the whole ledger; it runs on the `audit` queue.

    Raises Forbidden unless `actor` reads the ledger (auditors and superusers).
    """
    if not can_read_ledger(actor):
        raise Forbidden("only auditors and superusers may verify the audit ledger")
    with transaction.atomic():
        verification = LedgerVerification.objects.create(
            requested_by=actor, requested_by_label=label(actor)[:200], created_at=now(),
            allow_missing_checkpoint=allow_missing_checkpoint)
        audit_record(action="audit.verification_requested", actor=label(actor),
                     subject_type=SubjectType.LEDGER, subject_id="audit_entry", outcome="requested",
                     payload={"verification": verification.pk,
                              "allow_missing_checkpoint": allow_missing_checkpoint})
        transaction.on_commit(lambda: current_app.send_task(
            "audit.tasks.verify", [verification.pk], queue="audit"))
    return verification


def ledger_verification_run(*, verification_id: int) -> LedgerVerification | None:
    """Run a requested verification, keeping its row up to date; a finished one is left as
    it is (the message was a replay). Returns the row, or None if there is none."""
    with transaction.atomic():
        verification = (LedgerVerification.objects.select_for_update()
                        .filter(pk=verification_id).first())
        if verification is None or verification.finished:
            return verification
        verification.state = LedgerVerification.State.RUNNING
        verification.started_at, verification.entries_checked = now(), 0
        verification.entries_total = AuditEntry.objects.filter(sequence__isnull=False).count()
        verification.save(update_fields=["state", "started_at", "entries_checked", "entries_total"])
    rows = LedgerVerification.objects.filter(pk=verification.pk)
    try:
        check = ledger_check(
            allow_missing_checkpoint=verification.allow_missing_checkpoint,
            progress=lambda count: rows.update(entries_checked=count),
            stage=lambda text: rows.update(stage=text))
    except (ImproperlyConfigured, OSError, BotoCoreError, ClientError) as exc:
        rows.update(state=LedgerVerification.State.ERROR, finished_at=now(), stage="",
                    result=f"{WHAT}: could not be checked: {exc}")
    except Exception as exc:
        # Not left "running" for ever; the task's failure is logged with its traceback.
        rows.update(state=LedgerVerification.State.ERROR, finished_at=now(), stage="",
                    result=f"{WHAT}: the verification failed: {type(exc).__name__}: {exc}")
        raise
    else:
        rows.update(state=(LedgerVerification.State.PASSED if check.ok
                           else LedgerVerification.State.FAILED),
                    finished_at=now(), stage="", result=check.message, warnings=check.warnings,
                    entries_checked=check.report.count)
    return rows.first()


# --- the auditor's export ---------------------------------------------------------------------

EXPORT_STORAGE = "artifacts"
EXPORT_PREFIX = "audit-exports"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ledger_export_request(*, actor, fmt: str = "jsonl") -> LedgerExport:
    """Ask for an export of the whole ledger (JSON Lines or CSV) and its manifest.

    Raises Forbidden unless `actor` reads the ledger (auditors and superusers), ValueError
    for an unknown format.
    """
    if not can_read_ledger(actor):
        raise Forbidden("only auditors and superusers may export the audit ledger")
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}")
    with transaction.atomic():
        export = LedgerExport.objects.create(requested_by=actor, requested_by_label=label(actor)[:200],
                                             format=fmt, created_at=now())
        audit_record(action="audit.export_requested", actor=label(actor),
                     subject_type=SubjectType.LEDGER, subject_id="audit_entry", outcome="requested",
                     payload={"export": export.pk, "format": fmt})
        transaction.on_commit(lambda: current_app.send_task(
            "audit.tasks.export", [export.pk], queue="audit"))
    return export


def ledger_export_run(*, export_id: int) -> LedgerExport | None:
    """Write a requested export into the shared storage; a finished one is left as it is."""
    with transaction.atomic():
        export = LedgerExport.objects.select_for_update().filter(pk=export_id).first()
        if export is None or export.finished:
            return export
        export.state = LedgerExport.State.RUNNING
        export.save(update_fields=["state"])
    rows = LedgerExport.objects.filter(pk=export.pk)
    storage = storages[EXPORT_STORAGE]
    started = now()
    try:
        with tempfile.TemporaryDirectory() as directory:
            path = Path(directory) / f"audit-ledger-{started:%Y%m%dT%H%M%SZ}.{export.format}"
            # Every entry: from before the first to just after now (the clock may stand still).
            result = export_range(start=_EPOCH, end=started + timedelta(seconds=1),
                                  fmt=export.format, path=path)
            names = []
            for written in (result.path, result.manifest_path):
                with written.open("rb") as handle:
                    names.append(storage.save(f"{EXPORT_PREFIX}/{export.pk}/{written.name}",
                                              File(handle, name=written.name)))
    except (ImproperlyConfigured, OSError, BotoCoreError, ClientError) as exc:
        rows.update(state=LedgerExport.State.ERROR, finished_at=now(),
                    result=f"{WHAT}: could not be exported: {exc}")
    except Exception as exc:
        rows.update(state=LedgerExport.State.ERROR, finished_at=now(),
                    result=f"{WHAT}: the export failed: {type(exc).__name__}: {exc}")
        raise
    else:
        manifest = result.manifest
        rows.update(state=LedgerExport.State.DONE, finished_at=now(), entries=manifest["count"],
                    file=names[0], manifest=names[1],
                    result=(f"{manifest['count']} entries, sequences {manifest['first_sequence']}.."
                            f"{manifest['last_sequence']}; verify with `manage.py audit_verify "
                            f"--export {result.path.name}` beside its manifest"))
    return rows.first()


def ledger_export_open(*, actor, export_id: int, manifest: bool = False) -> tuple[str, File]:
    """(file name, open file) of a finished export, or of its manifest.

    Raises Forbidden unless `actor` reads the ledger, LedgerExport.DoesNotExist, and
    NotAllowed while the export is not done.
    """
    if not can_read_ledger(actor):
        raise Forbidden("only auditors and superusers may read the audit ledger's exports")
    export = LedgerExport.objects.get(pk=export_id)
    if export.state != LedgerExport.State.DONE:
        raise NotAllowed(f"export {export.pk} is {export.state}, not done")
    name = export.manifest if manifest else export.file
    return name.rsplit("/", 1)[-1], storages[EXPORT_STORAGE].open(name, "rb")
