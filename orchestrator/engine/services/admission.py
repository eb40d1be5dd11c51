"""Refused starts in the ledger: once per subject, limit and window, never once per request.

Every start path refuses the same two ways — the team's cap on unfinished runs (or its spent
budget: `budgets.services.budget_admit`) and a rate (a person's or a token's run starts, the
API's throttles; a trigger's `max_per_minute`) — with 429 and `Retry-After`. A flood of refused
requests must not become a flood of ledger entries, so a refusal is audited only when it is
the first for its subject and limit in a window of AUDIT_WINDOW_S seconds. The entry carries
how many were refused in the subject's previous window (counted in the cache: Redis when
REDIS_URL is set, else the embedded file cache), so the ledger keeps the scale of a flood.
"""
from collections.abc import Callable

from django.core.cache import cache
from django.db import transaction

from audit.services import audit_record

from ..authz import Actor, System, label
from ..clock import now

AUDIT_WINDOW_S = 60


def identity_of(actor) -> str:
    """The cache's name for whom a window counts: a person by id and the moment the account
    was made (an id given again to a new account starts afresh), the engine by its label."""
    if isinstance(actor, System):
        return str(actor)
    return f"user:{actor.pk}:{actor.date_joined.timestamp()}"


def refusal_audit_once(*, limit: str, subject: str, write: Callable[[dict], None]) -> bool:
    """Count one refusal of `subject` (a person, a token, a trigger) by `limit`, and call
    `write(window)` — which appends the ledger entry, in a transaction this opens — when it is
    the first of the window. `window` is {"window_start", "window_s",
    "refused_in_previous_window"}. Returns whether an entry was written."""
    moment = int(now().timestamp())
    window = moment // AUDIT_WINDOW_S
    key = f"admission-refused:{limit}:{subject}"
    # A counter per window: `add` makes the first request of a window the one that writes.
    first = cache.add(f"{key}:{window}", 1, timeout=AUDIT_WINDOW_S * 3)
    if not first:
        try:
            cache.incr(f"{key}:{window}")
        except ValueError:  # expired between the add and the incr: count it afresh
            cache.add(f"{key}:{window}", 1, timeout=AUDIT_WINDOW_S * 3)
        return False
    previous = cache.get(f"{key}:{window - 1}") or 0
    with transaction.atomic():
        write({"window_start": window * AUDIT_WINDOW_S, "window_s": AUDIT_WINDOW_S,
               "refused_in_previous_window": previous})
    return True


def start_refusal_record(*, limit: str, actor: Actor, team: str, path: str,
                         problems: list[dict], retry_after_s: int | None,
                         subject: str = "", identity: str = "") -> bool:
    """Audit a refused start (`admission.refused`) once per window for `subject` (default:
    the actor; a token's throttle names the token), counted in the cache as `identity`
    (default: `identity_of(actor)`)."""
    who = label(actor)

    def write(window: dict) -> None:
        audit_record(action="admission.refused", actor=who, subject_type="admission",
                     subject_id=subject or who, outcome=limit, team=team,
                     payload={"limit": limit, "path": path, "problems": problems,
                              "retry_after_s": retry_after_s, **window})

    return refusal_audit_once(limit=limit, subject=identity or identity_of(actor), write=write)
