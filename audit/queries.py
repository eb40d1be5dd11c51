"""Reads of the ledger for auditors: entries by run, subject, actor, kind, team and time, a page
at a time by a keyset cursor, and the verification status.

Every function checks the reader (`audit.access.can_read_ledger`: auditors and superusers) and
raises `Forbidden` otherwise; the API views only translate. Pages are keyed on the entry's id,
never on an offset: the ledger is several chains (`audit.chain`: one per shard), each with its
own sequence, and the id is the one position every entry has across them, given when it is
recorded. A page holds the same entries however many are appended while an auditor pages
through, and the next page costs an index range scan, not a count; a run's entries are one
shard's, so its pages list its chain. Only chained entries are read (on PostgreSQL an entry
has no sequence until its transaction commits). This module reads; it must not append or change anything.
"""
from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from django.db.models import Q, QuerySet

from orchestrator.engine.errors import Forbidden

from .access import can_read_ledger
from .models import AuditEntry, CheckpointRecord, LedgerExport, LedgerVerification

NEWEST, OLDEST = "newest", "oldest"
ORDERS = (NEWEST, OLDEST)
MAX_PAGE = 500


class BadCursor(ValueError):
    """The cursor was not one a page of this order handed out."""


@dataclass(frozen=True)
class EntryFilter:
    """What an auditor asks for; every field given narrows the entries (an AND)."""

    run: UUID | None = None
    subject_type: str = ""
    subject_id: str = ""
    actor: str = ""
    kind: str = ""          # an action ("step.completed"), or its family ("step")
    team: str = ""
    workflow: str = ""
    since: datetime | None = None   # created at or after
    until: datetime | None = None   # created before

    def describe(self) -> dict:
        """The filters given, as JSON values (for manifests and the ledger's own entries)."""
        values = {"run": str(self.run) if self.run else "", "subject_type": self.subject_type,
                  "subject_id": self.subject_id, "actor": self.actor, "kind": self.kind,
                  "team": self.team, "workflow": self.workflow,
                  "since": self.since.isoformat() if self.since else "",
                  "until": self.until.isoformat() if self.until else ""}
        return {name: value for name, value in values.items() if value}

    def apply(self, entries: QuerySet) -> QuerySet:
        exact = {"run_id": self.run, "subject_type": self.subject_type,
                 "subject_id": self.subject_id, "actor": self.actor, "team": self.team,
                 "workflow": self.workflow}
        entries = entries.filter(**{name: value for name, value in exact.items() if value})
        if self.kind:
            entries = entries.filter(Q(action=self.kind) | Q(action__startswith=f"{self.kind}."))
        if self.since is not None:
            entries = entries.filter(created_at__gte=self.since)
        if self.until is not None:
            entries = entries.filter(created_at__lt=self.until)
        return entries


def _check(actor) -> None:
    if not can_read_ledger(actor):
        raise Forbidden("only auditors and superusers may read the audit ledger")


def entries_matching(*, actor, where: EntryFilter, order: str = OLDEST,
                     through: int | None = None) -> QuerySet:
    """The chained entries `where` selects, in the order they were recorded (`order`), up to
    shard 0's sequence `through`.

    Raises Forbidden unless `actor` reads the ledger, ValueError for an unknown order.
    """
    _check(actor)
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}")
    entries = where.apply(AuditEntry.objects.filter(sequence__isnull=False))
    if through is not None:
        entries = entries.filter(~Q(shard=0) | Q(sequence__lte=through))
    return entries.order_by("-id" if order == NEWEST else "id")


@dataclass(frozen=True)
class EntryPage:
    entries: list[AuditEntry]
    next_cursor: str | None   # None on the last page


def encode_cursor(order: str, position: int) -> str:
    return base64.urlsafe_b64encode(json.dumps([order, position]).encode()).decode().rstrip("=")


def decode_cursor(cursor: str, order: str) -> int:
    """The entry id a cursor stands after. Raises BadCursor."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        given_order, position = json.loads(text)
    except (binascii.Error, UnicodeDecodeError, ValueError, TypeError) as exc:
        raise BadCursor("the cursor is not one this API handed out") from exc
    if given_order != order or not isinstance(position, int) or isinstance(position, bool):
        raise BadCursor(f"the cursor was handed out for another order than {order!r}")
    return position


def entries_page(*, actor, where: EntryFilter, order: str = NEWEST, cursor: str | None = None,
                 limit: int = 50) -> EntryPage:
    """One page of the entries `where` selects, after `cursor` (from the previous page).

    Raises Forbidden unless `actor` reads the ledger, BadCursor, ValueError for an order or a
    limit out of range.
    """
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be from 1 to {MAX_PAGE}")
    entries = entries_matching(actor=actor, where=where, order=order)
    if cursor:
        after = decode_cursor(cursor, order)
        entries = entries.filter(**{"id__lt" if order == NEWEST else "id__gt": after})
    rows = list(entries[:limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    return EntryPage(rows, encode_cursor(order, rows[-1].id) if more else None)


@dataclass(frozen=True)
class VerificationStatus:
    last_passed: LedgerVerification | None    # its range is what is known intact
    last: LedgerVerification | None           # the newest, whatever its outcome
    failures: list[LedgerVerification]        # the newest that did not pass
    last_checkpoint: CheckpointRecord | None
    head_sequence: int | None


def verification_status(*, actor, failures: int = 10) -> VerificationStatus:
    """What is known of the ledger's integrity. Raises Forbidden unless `actor` reads it."""
    _check(actor)
    runs = LedgerVerification.objects.order_by("-created_at", "-id")
    head = (AuditEntry.objects.filter(sequence__isnull=False).order_by("-sequence")
            .values_list("sequence", flat=True).first())
    return VerificationStatus(
        last_passed=runs.filter(state=LedgerVerification.State.PASSED).first(),
        last=runs.first(),
        failures=list(runs.filter(state__in=(LedgerVerification.State.FAILED,
                                             LedgerVerification.State.ERROR))[:failures]),
        last_checkpoint=CheckpointRecord.objects.order_by("-sequence", "-created_at").first(),
        head_sequence=head)


def verification_of(*, actor, verification_id: int) -> LedgerVerification:
    """One verification. Raises Forbidden unless `actor` reads the ledger, and
    LedgerVerification.DoesNotExist."""
    _check(actor)
    return LedgerVerification.objects.get(pk=verification_id)


def export_of(*, actor, export_id: int) -> LedgerExport:
    """One whole-ledger export. Raises Forbidden unless `actor` reads the ledger, and
    LedgerExport.DoesNotExist."""
    _check(actor)
    return LedgerExport.objects.get(pk=export_id)
