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

import json
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from botocore.exceptions import BotoCoreError, ClientError
from celery import current_app
from django.core.exceptions import ImproperlyConfigured
from django.core.files import File
from django.core.files.storage import storages
from django.db import transaction
from django.db.models import Q, QuerySet

from orchestrator.engine.attestation import attestation_digest, attestation_problem
from orchestrator.engine.authz import label
from orchestrator.engine.clock import now
from orchestrator.engine.errors import Forbidden, NotAllowed
from orchestrator.engine.states import StepState
from orchestrator.models import MapItem, StepRun

from . import chain
from .access import can_read_ledger
from .anchoring import Checkpoint, checkpoint_trusted, ledger_anchor_check
from .chain import PRUNE_ACTION, Report, seal_pending, verify_ledger, verify_ledger_after
from .export import FORMATS, export_range, stream_lines, stream_manifest
from .models import AuditEntry, CheckpointRecord, LedgerExport, LedgerVerification, SubjectType
from .queries import OLDEST, EntryFilter, entries_matching
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
    mode: str = "full"
    base: str = ""                    # the checkpoint an incremental check started after


@dataclass(frozen=True)
class _Base:
    """Where an incremental verification starts: a signed checkpoint a passed one covered."""

    sequence: int
    hash: str
    name: str
    heads: dict = field(default_factory=dict)  # shard -> (sequence, hash), shard 0's included
    signed_at: datetime | None = None


#: The entries that record a step's completion and name its attestation (`_chained`).
STEP_DONE_ACTIONS = ("step.completed", "step.attested")


def _incremental_base() -> tuple[_Base | None, str]:
    """The newest signed checkpoint within the range the newest passed verification walked
    (that range, and every one before it back to a full walk, being known intact), its
    signature checked in the store; or None and why there is none."""
    passed = (LedgerVerification.objects.filter(state=LedgerVerification.State.PASSED,
                                                through_sequence__isnull=False)
              .order_by("-through_sequence", "-id").first())
    if passed is None:
        return None, "no earlier verification passed"
    verified = {int(shard): head[0] for shard, head in passed.through_heads.items()}
    verified[0] = passed.through_sequence
    # Every head the checkpoint signed must lie within what the verification walked.
    record = next((record for record in CheckpointRecord.objects
                   .filter(sequence__lte=passed.through_sequence).order_by("-sequence", "-created_at")
                   .only("name", "sequence", "hash", "heads", "created_at").iterator(chunk_size=50)
                   if all(head[0] <= verified.get(int(shard), 0) for shard, head in record.heads.items())),
                  None)
    if record is None:
        return None, f"no signed checkpoint lies within what verification {passed.pk} checked"
    checkpoint, why = checkpoint_trusted(record)
    if checkpoint is None:
        return None, why
    return _Base(checkpoint.sequence, checkpoint.hash, record.name, checkpoint.heads,
                 record.created_at), ""


def _holes_before(base: _Base) -> str:
    """Entries missing from the start of a shard's chain at or before the base: its first entry
    is not the first (1, or the one just after its prune checkpoint). One index probe per
    shard, so the check costs the same however long the history; an entry removed from the
    middle, like one edited in place, is what the next full verification finds."""
    pruned = chain.prune_anchors()
    for shard, (sequence, _hash) in sorted({**base.heads, 0: (base.sequence, base.hash)}.items()):
        first = (AuditEntry.objects.filter(shard=shard, sequence__isnull=False, sequence__lte=sequence)
                 .order_by("sequence").values_list("sequence", flat=True).first())
        if first is None or first == 1 or first - 1 in pruned.get(shard, {}):
            continue
        where = f" of shard {shard}" if shard else ""
        return (f"{first - 1} entries{where} before sequence {first} are missing and no prune "
                "checkpoint covers them")
    return ""


def ledger_check(*, allow_missing_checkpoint: bool = False, incremental: bool = False,
                 progress: Callable[[int], None] | None = None,
                 stage: Callable[[str], None] | None = None) -> LedgerCheck:
    """Verify the ledger's chain and its anchoring. `progress(entries read)` and
    `stage(description)` report how far it got.

    `incremental` walks only the entries after the newest signed checkpoint that an earlier
    verification found intact, and checks that none at or before it is missing; without such
    a checkpoint it walks the whole chain, with a warning saying why.

    Raises ImproperlyConfigured when there is no key to check the checkpoints with, and the
    checkpoint store's errors (OSError, botocore's) when it cannot be read.
    """
    warnings = [f"trigger {name} is missing or disabled: the database no longer refuses "
                "changes to the ledger" for name in missing_guards()]
    base = None
    if incremental:
        base, why = _incremental_base()
        if base is None:
            warnings.append(f"walked the whole chain, not only what is new: {why}")
    if stage:
        stage("walking the chain" if base is None else
              f"walking the chain after the checkpoint at sequence {base.sequence}")
    if base is None:
        report = verify_ledger(progress=progress)
        mode, anchored_from = "full", report
    else:
        report = verify_ledger_after(sequence=base.sequence, hash=base.hash, heads=base.heads,
                                     progress=progress)
        holes = _holes_before(base) if report.broken is None else ""
        if holes:
            return LedgerCheck(False, f"{WHAT}: BROKEN before the checkpoint at sequence "
                                      f"{base.sequence}: {holes}", report, warnings, "incremental", base.name)
        # The signed checkpoints from the base on are compared, the base's included.
        # A prune since may have removed the base's own entry.
        mode, anchored_from = "incremental", replace(
            report, first_sequence=max(base.sequence, chain.first_sequence(0) or 0))
    if report.broken is not None:
        return LedgerCheck(False, f"{WHAT}: BROKEN at {report.broken} "
                                  f"({report.count} entries verified before it)", report, warnings,
                           mode, base.name if base else "")
    # Incremental: the outputs of the steps whose completion the new entries record, those
    # before having been checked by the verification that covered the checkpoint.
    steps = _steps_named_after({**base.heads, 0: (base.sequence, base.hash)}) if base else None
    result = _anchored(report, anchored_from, warnings, allow_missing_checkpoint, stage,
                       outputs_of=steps)
    if base is None:
        return result
    message = result.message.replace(
        f"{WHAT}: OK, {report.count} entries, sequences",
        f"{WHAT}: OK (incremental, from the checkpoint at sequence {base.sequence}), "
        f"{report.count} new entries, sequences")
    if report.count == 0 and result.ok:
        message = (f"{WHAT}: OK (incremental), no entry after the checkpoint at sequence "
                   f"{base.sequence}, head {report.head_hash}")
    return replace(result, message=message, mode="incremental", base=base.name)


def _anchored(report: Report, anchored_from: Report, warnings: list[str],
              allow_missing_checkpoint: bool, stage: Callable[[str], None] | None,
              outputs_of: list[int] | None = None) -> LedgerCheck:
    if stage:
        stage("comparing with the signed checkpoints")
    anchor = ledger_anchor_check(anchored_from)
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
    if stage:
        stage("checking the steps' output attestations")
    outputs = outputs_check(step_ids=outputs_of)
    if outputs:
        return LedgerCheck(False, f"{WHAT}: {len(outputs)} step output(s) fail their attestation: "
                           + "; ".join(outputs[:20]) + (" ..." if len(outputs) > 20 else ""),
                           report, warnings)
    if report.count == 0:
        return LedgerCheck(True, f"{WHAT}: OK (empty){anchored}", report, warnings)
    return LedgerCheck(True, f"{WHAT}: OK, {report.count} entries, sequences "
                             f"{report.first_sequence}..{report.head_sequence}, head "
                             f"{report.head_hash}{anchored}", report, warnings)


def _steps_named_after(known: dict) -> list[int]:
    """Ids of the completed steps that the entries after each shard's head in `known` (every
    entry of a shard not in it) record completing: read along the (shard, sequence) index, so
    as many as are new, then each step through its (run, name) key."""
    named = set()
    for shard in chain.shards_present():
        entries = AuditEntry.objects.filter(shard=shard, sequence__isnull=False,
                                            action__in=STEP_DONE_ACTIONS, run_id__isnull=False)
        if shard in known:
            entries = entries.filter(sequence__gt=known[shard][0])
        named.update(entries.order_by("sequence").values_list("run_id", "step_name")
                     .iterator(chunk_size=2000))
    named, ids = sorted(named), []
    for start in range(0, len(named), 500):
        which = Q(pk__in=[])
        for run_id, name in named[start:start + 500]:
            which |= Q(run_id=run_id, name=name)
        ids += StepRun.objects.filter(which, state=StepState.COMPLETED).values_list("id", flat=True)
    return ids


def outputs_check(*, run_id=None, step_ids: list[int] | None = None) -> list[str]:
    """One line per completed step (of `run_id`, of `step_ids`, or of every run) whose output fails its
    attestation (`orchestrator.engine.attestation`): none, altered, of an unregistered or
    revoked key, no longer the output it names, or not the record the step's completion entry
    in the ledger chained; and per succeeded map item whose output fails its own."""
    steps = StepRun.objects.filter(state=StepState.COMPLETED).only(
        "id", "run_id", "name", "output", "attestation", "finished_at").order_by("id")
    if run_id is not None:
        steps = steps.filter(run_id=run_id)
    if step_ids is not None:
        steps = steps.filter(id__in=step_ids)
    pruned_before = _pruned_before()
    problems = []
    for step in steps.iterator(chunk_size=500):
        problem = attestation_problem(step_id=step.id, output=step.output,
                                      attestation=step.attestation)
        if problem is None and not _chained(step, pruned_before=pruned_before):
            problem = "the attestation is not the one the ledger chained as the step completed"
        if problem:
            problems.append(f"run {step.run_id} step '{step.name}' (id {step.id}): {problem}")
    # A map's items: each succeeded one is stored with a record of its own, which the join reads.
    items = MapItem.objects.filter(done=True, error__isnull=True).select_related("step").only(
        "id", "step_id", "index", "output", "attestation", "step__run_id", "step__name").order_by("id")
    if run_id is not None:
        items = items.filter(step__run_id=run_id)
    if step_ids is not None:
        items = items.filter(step_id__in=step_ids)
    for item in items.iterator(chunk_size=500):
        problem = attestation_problem(step_id=item.step_id, output=item.output,
                                      attestation=item.attestation, item=item.index)
        if problem:
            problems.append(f"run {item.step.run_id} step '{item.step.name}' item {item.index} "
                            f"(id {item.step_id}): {problem}")
    return problems


def _chained(step: StepRun, *, pruned_before: datetime | None) -> bool:
    """Whether the ledger names this attestation's hash: a worker's `step.completed` entry, or
    the `step.attested` entry of the process that completed the step otherwise. A step that
    completed before the ledger's retention pruned it (a run kept longer than its entries, under
    a legal hold) has no entry left to name it; its record's own signature still holds."""
    digest = attestation_digest(step.attestation)
    if AuditEntry.objects.filter(run_id=step.run_id, step_name=step.name,
                                 action__in=("step.completed", "step.attested"),
                                 payload__contains=digest).exists():
        return True
    return bool(pruned_before and step.finished_at and step.finished_at < pruned_before)


def _pruned_before() -> datetime | None:
    """What the newest prune of the ledger deleted entries older than, if it was pruned."""
    # Newest by the (action, created_at) index: ordered by id alone, the planner walks the
    # primary key backwards through every entry when there is no prune.
    latest = AuditEntry.objects.filter(action=PRUNE_ACTION).order_by("-created_at", "-id").values_list(
        "payload", flat=True).first()
    return datetime.fromisoformat(json.loads(latest)["before"]) if latest else None


# --- the auditor's verification job -----------------------------------------------------------


def ledger_verification_request(*, actor, allow_missing_checkpoint: bool = False,
                                incremental: bool = False) -> LedgerVerification:
    """Ask for a verification of the whole ledger (`incremental`: of what is new since the
    last verified checkpoint, see `ledger_check`); it runs on the `audit` queue.

    Raises Forbidden unless `actor` reads the ledger (auditors and superusers).
    """
    if not can_read_ledger(actor):
        raise Forbidden("only auditors and superusers may verify the audit ledger")
    with transaction.atomic():
        verification = LedgerVerification.objects.create(
            requested_by=actor, requested_by_label=label(actor)[:200], created_at=now(),
            allow_missing_checkpoint=allow_missing_checkpoint,
            mode="incremental" if incremental else "full")
        payload = {"verification": verification.pk, "allow_missing_checkpoint": allow_missing_checkpoint}
        if incremental:
            payload["mode"] = "incremental"
        audit_record(action="audit.verification_requested", actor=label(actor),
                     subject_type=SubjectType.LEDGER, subject_id="audit_entry", outcome="requested",
                     payload=payload)
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
        seal_pending()  # the total counts entries this transaction's caller recorded
        known = {}
        if verification.mode == "incremental":
            base, _why = _incremental_base()
            if base is not None:
                known = {**base.heads, 0: (base.sequence, base.hash)}
        verification.entries_total = _entries_after(known)
        verification.save(update_fields=["state", "started_at", "entries_checked", "entries_total"])
    rows = LedgerVerification.objects.filter(pk=verification.pk)
    try:
        check = ledger_check(
            allow_missing_checkpoint=verification.allow_missing_checkpoint,
            incremental=verification.mode == "incremental",
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
                    entries_checked=check.report.count, mode=check.mode, base_checkpoint=check.base,
                    **_range(check))
    return rows.first()


def _entries_after(known: dict) -> int:
    """How many sealed entries follow each shard's head in `known` (every entry of a shard not
    in it), counted per shard over its (shard, sequence) index: one condition over every shard
    at once is planned as a scan of the whole table."""
    total = 0
    for shard in chain.shards_present():
        sealed = AuditEntry.objects.filter(shard=shard, sequence__isnull=False)
        if shard in known:
            sealed = sealed.filter(sequence__gt=known[shard][0])
        total += sealed.count()
    return total


def _range(check: LedgerCheck) -> dict:
    """What a passed check found intact, for the next incremental one to start from."""
    report = check.report
    if not check.ok or report.head_sequence is None:
        return {}
    others = {str(shard): list(head) for shard, head in report.heads.items() if shard}
    return {"from_sequence": report.first_sequence, "through_sequence": report.head_sequence,
            "through_hash": report.head_hash or "", "through_heads": others}


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


# --- a selection of entries, exported through the API ------------------------------------------


@dataclass(frozen=True)
class LedgerSelection:
    """Entries an auditor selected, up to a sequence a signed checkpoint covers."""

    entries: QuerySet
    through: int
    checkpoint: Checkpoint


def ledger_selection(*, actor, where: EntryFilter, through: int | None = None) -> LedgerSelection:
    """The entries `where` selects up to `through` (default: the newest signed checkpoint's
    sequence), in chain order, with the checkpoint that vouches for the chain through them.

    Only entries a checkpoint covers are exported, so every exported entry lies under a
    signature the database does not hold; newer ones come with the next checkpoint.

    Raises Forbidden unless `actor` reads the ledger; NotAllowed when no signed checkpoint
    covers `through` (or none is written yet) or the newest cannot be trusted.
    """
    entries = entries_matching(actor=actor, where=where, order=OLDEST)
    records = CheckpointRecord.objects.order_by("sequence", "created_at")
    record = (records.filter(sequence__gte=through).first() if through is not None
              else records.order_by("-sequence", "-created_at").first())
    if record is None:
        raise NotAllowed("no signed checkpoint covers these entries yet: the audit worker "
                         "writes one at least every AUDIT_CHECKPOINT_INTERVAL_S")
    checkpoint, why = checkpoint_trusted(record)
    if checkpoint is None:
        raise NotAllowed(why)
    through = record.sequence if through is None else through
    # Shard 0 up to `through`; every other shard up to the head the checkpoint signed.
    covered = Q(shard=0, sequence__lte=through)
    for shard, (sequence, _hash) in checkpoint.heads.items():
        if shard:
            covered |= Q(shard=shard, sequence__lte=sequence)
    return LedgerSelection(entries.filter(covered), through, checkpoint)


def ledger_stream(*, actor, where: EntryFilter, fmt: str,
                  through: int | None = None) -> tuple[LedgerSelection, Iterator[str]]:
    """The export file of a selection, as pieces of text to stream, after recording who
    exported what (`audit.exported`). Raises what `ledger_selection` raises, and ValueError
    for an unknown format."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}")
    selection = ledger_selection(actor=actor, where=where, through=through)
    with transaction.atomic():
        audit_record(action="audit.exported", actor=label(actor), subject_type=SubjectType.LEDGER,
                     subject_id="audit_entry", outcome="streamed",
                     payload={"format": fmt, "through_sequence": selection.through,
                              "selection": where.describe()})
    return selection, stream_lines(selection.entries, fmt)


def ledger_stream_manifest(*, actor, where: EntryFilter, fmt: str, through: int) -> dict:
    """The manifest of what `ledger_stream` streamed with the same selection, format and
    `through`. Raises what `ledger_selection` raises, and ValueError for an unknown format."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}")
    selection = ledger_selection(actor=actor, where=where, through=through)
    return stream_manifest(entries=selection.entries, fmt=fmt, selection=where.describe(),
                           through=selection.through, checkpoint=selection.checkpoint)
