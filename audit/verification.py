"""Verifying the whole ledger: the one check `manage.py audit_verify` and the admin's
*Verify ledger* both run, and the auditor's verification job.

`ledger_check` walks the chain (`audit.chain`), then compares it with the signed checkpoints
(`audit.anchoring`): it passes only when the chain is intact, matches every checkpoint, and
no checkpoint is expected and missing — unless the caller accepts a missing one, which is
then a warning.

An auditor asks for a verification (`ledger_verification_request`: auditors and superusers,
checked here); the task `audit.tasks.verify` runs it on the `audit` queue, where the signing
key is (`ledger_verification_run`), and keeps its row up to date as it goes, so the admin can
show its progress, its result and when it ran.

This module reads the ledger; the only entry it appends is the request's.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from botocore.exceptions import BotoCoreError, ClientError
from celery import current_app
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

from orchestrator.authz import label
from orchestrator.clock import now
from orchestrator.errors import Forbidden

from .access import can_read_ledger
from .anchoring import ledger_anchor_check
from .chain import Report, verify_ledger
from .models import AuditEntry, LedgerVerification, SubjectType
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
    else:
        rows.update(state=(LedgerVerification.State.PASSED if check.ok
                           else LedgerVerification.State.FAILED),
                    finished_at=now(), stage="", result=check.message, warnings=check.warnings,
                    entries_checked=check.report.count)
    return rows.first()
