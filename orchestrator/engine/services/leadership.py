"""Leader leases: one holder at a time for work that must not run twice at once (beat).

A lease is one `Leadership` row per name: (holder, expires_at). `leadership_hold` takes or
renews it with one conditional UPDATE — it succeeds only for the holder itself or once the
lease has run out — or creates the row; the unique name makes two first takers race safely. A
holder that stops renewing (killed, paused, cut off from the database) loses the lease when it
expires, and the next contender takes it over: a handover takes at most the lease plus one
contender's poll. Times come from each process's clock: beat hosts keep their clocks in sync
(NTP), and the lease must be longer than their skew.
"""
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import Q

from orchestrator.models import Leadership

from ..clock import now


def leadership_hold(*, name: str, holder: str, lease_s: float) -> bool:
    """Take or renew the lease `name` for `holder` for `lease_s` seconds. True if `holder`
    holds it now; False while another holder's lease runs."""
    at = now()
    until = at + timedelta(seconds=lease_s)
    if Leadership.objects.filter(Q(holder=holder) | Q(expires_at__lt=at), name=name).update(
            holder=holder, expires_at=until):
        return True
    try:
        with transaction.atomic():
            Leadership.objects.create(name=name, holder=holder, expires_at=until)
    except IntegrityError:
        return False  # another holder's row, not expired
    return True


def leadership_release(*, name: str, holder: str) -> bool:
    """Give the lease up (a clean shutdown), so the next contender need not wait it out."""
    return bool(Leadership.objects.filter(name=name, holder=holder).update(expires_at=now()))


def leadership_holder(*, name: str) -> str | None:
    """Who holds the lease `name` now, if anyone."""
    row = Leadership.objects.filter(name=name, expires_at__gte=now()).first()
    return row.holder if row else None
