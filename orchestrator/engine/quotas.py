"""Quotas of constrained dependencies — model providers and named connections — shared by every
worker and divided between capacity classes (docs/operations.md#provider-quotas).

STEPWISE_QUOTAS names a dependency (`model:<name>`, `connection:<name>`, or any name
`limits.dependency_of` gives) and its limits: `concurrent` calls in flight and
`tokens_per_minute` (per calendar minute). Before a call a worker takes a reservation
(`quota_reserve`): one call slot and the call's estimated tokens; after it, it gives the slot
back and settles the tokens to what the call used (`quota_release`). A reservation that does not
fit is refused with the reason and how long to wait, and nothing is taken.

Each capacity class is guaranteed its share of a limit (`capacity.CapacityClass.shares`): it may
always use that much. Beyond it, it borrows what other classes leave, except the unused guarantee
of a class that has asked within the last STEPWISE_QUOTA_IDLE_S seconds — so an idle class's share
is lent out, and a busy one's is kept for it.

Each dependency's state is one record changed under a lock that all workers share: Redis (a
lock and a key, when REDIS_URL is set) or, in the embedded default, a file lock beside a JSON
file in the var directory. What to decide is a pure function of that record (`decide`). A slot
expires with the call's lease (`hold_s`), so a worker that dies mid-call holds nothing for long.
Reads settings and the shared store only: no database.
"""
import fcntl
import json
import os
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from django.conf import settings

from .capacity import capacity_classes
from .clock import now as clock_now

DEFAULT_IDLE_S = 30.0
LOCK_WAIT_S = 10


@dataclass(frozen=True)
class Quota:
    concurrent: int | None = None
    tokens_per_minute: int | None = None


@dataclass(frozen=True)
class Reservation:
    """A call's hold on a dependency: one slot, `tokens` of this minute."""
    dependency: str
    capacity: str
    holder: str
    tokens: int
    minute: int


@dataclass(frozen=True)
class Refusal:
    """Why a call may not go yet, and how long until it may try again."""
    dependency: str
    capacity: str
    limit: str  # "concurrent" or "tokens_per_minute"
    retry_in_s: float

    @property
    def reason(self) -> str:
        what = "a call slot" if self.limit == "concurrent" else "tokens this minute"
        return f"waiting for {what} of {self.dependency} ({self.capacity} quota)"


@dataclass(frozen=True)
class QuotaUsage:
    """What one class holds of a dependency now (for metrics and the operations page)."""
    dependency: str
    capacity: str
    calls: int
    tokens: int  # this minute
    calls_limit: int | None
    tokens_limit: int | None
    guaranteed_calls: float | None
    guaranteed_tokens: float | None


def quota_of(dependency: str) -> Quota | None:
    found = (getattr(settings, "STEPWISE_QUOTAS", None) or {}).get(dependency)
    if not found:
        return None
    return Quota(found.get("concurrent"), found.get("tokens_per_minute"))


def quota_reserve(dependency: str, capacity: str, tokens: int, *,
                  hold_s: float) -> Reservation | Refusal | None:
    """Reserve one call of `dependency` for a run of `capacity` expected to use `tokens`,
    for at most `hold_s` seconds. None when the dependency has no quota."""
    quota = quota_of(dependency)
    if quota is None:
        return None
    if quota.tokens_per_minute:  # a call larger than the whole quota would never fit
        tokens = min(tokens, quota.tokens_per_minute)
    at = _seconds()
    holder = uuid.uuid4().hex
    with _locked(dependency) as store:
        state, outcome = decide(store.read(), quota, _shares(dependency), capacity=capacity,
                                tokens=tokens, holder=holder, at=at, hold_s=hold_s,
                                idle_s=_idle_s())
        store.write(state)
    if outcome is not None:
        return Refusal(dependency, capacity, *outcome)
    return Reservation(dependency, capacity, holder, tokens, int(at // 60))


def quota_release(reservation: Reservation, *, tokens_used: int | None = None) -> None:
    """Give back `reservation`'s call slot; settle its tokens to `tokens_used` (None: keep the
    estimate, for a call whose use is unknown)."""
    with _locked(reservation.dependency) as store:
        state = store.read()
        state.get("calls", {}).pop(reservation.holder, None)
        if tokens_used is not None and state.get("minute") == reservation.minute:
            spent = state.setdefault("tokens", {})
            spent[reservation.capacity] = max(
                spent.get(reservation.capacity, 0) + tokens_used - reservation.tokens, 0)
        store.write(state)


def quota_usage(dependencies: list[str] | None = None) -> list[QuotaUsage]:
    """What every class holds of each dependency with a quota, read without taking anything."""
    configured = getattr(settings, "STEPWISE_QUOTAS", None) or {}
    at = _seconds()
    usage = []
    for dependency in dependencies or sorted(configured):
        quota = quota_of(dependency)
        if quota is None:
            continue
        with _locked(dependency) as store:
            state = _fresh(store.read(), at)
        calls = _calls_by_class(state)
        shares = _shares(dependency)
        for name in capacity_classes():
            usage.append(QuotaUsage(
                dependency, name, calls.get(name, 0), state["tokens"].get(name, 0),
                quota.concurrent, quota.tokens_per_minute,
                quota.concurrent * shares[name] if quota.concurrent else None,
                quota.tokens_per_minute * shares[name] if quota.tokens_per_minute else None))
    return usage


# --- the decision ----------------------------------------------------------------------------


def decide(state: dict, quota: Quota, shares: dict[str, float], *, capacity: str, tokens: int,
           holder: str, at: float, hold_s: float, idle_s: float) -> tuple[dict, tuple | None]:
    """The record after a request for one call of `capacity` with `tokens`, and None when it was
    granted, else (limit, seconds to wait). Pure: the caller holds the lock."""
    state = _fresh(state, at)
    state["seen"][capacity] = at
    active = {name for name, seen in state["seen"].items() if at - seen < idle_s}
    calls = _calls_by_class(state)
    active |= set(calls)
    if quota.concurrent and not _fits(calls, capacity, 1, quota.concurrent, shares, active):
        return state, ("concurrent", 0.2)
    if quota.tokens_per_minute and not _fits(state["tokens"], capacity, tokens,
                                             quota.tokens_per_minute, shares, active):
        return state, ("tokens_per_minute", max(60 - at % 60, 0.05))
    state["calls"][holder] = [capacity, at + hold_s]
    state["tokens"][capacity] = state["tokens"].get(capacity, 0) + tokens
    return state, None


def _fits(used: dict[str, int], capacity: str, amount: int, limit: int,
          shares: dict[str, float], active: set[str]) -> bool:
    """Whether `capacity` may take `amount` more: within its guarantee, or borrowing what the
    active classes other than it leave of theirs unused."""
    total = sum(used.values())
    if total + amount > limit:
        return False
    mine = used.get(capacity, 0)
    if mine + amount <= limit * shares.get(capacity, 0.0):
        return True
    kept = sum(max(limit * shares.get(name, 0.0) - used.get(name, 0), 0.0)
               for name in active if name != capacity)
    return total + amount <= limit - kept + 1e-9


def _fresh(state: dict, at: float) -> dict:
    """The record as of `at`: expired call slots dropped, a new minute's tokens at zero."""
    minute = int(at // 60)
    calls = {holder: held for holder, held in (state.get("calls") or {}).items() if held[1] > at}
    tokens = dict(state.get("tokens") or {}) if state.get("minute") == minute else {}
    return {"calls": calls, "tokens": tokens, "minute": minute,
            "seen": dict(state.get("seen") or {})}


def _calls_by_class(state: dict) -> dict[str, int]:
    counted: dict[str, int] = {}
    for capacity, _ in state["calls"].values():
        counted[capacity] = counted.get(capacity, 0) + 1
    return counted


def _shares(dependency: str) -> dict[str, float]:
    return {name: known.share_of(dependency) for name, known in capacity_classes().items()}


def _idle_s() -> float:
    return float(getattr(settings, "STEPWISE_QUOTA_IDLE_S", DEFAULT_IDLE_S))


def _seconds() -> float:
    return clock_now().timestamp()


# --- the shared record -----------------------------------------------------------------------


class _Store:
    def __init__(self, read, write):
        self.read, self.write = read, write


@contextmanager
def _locked(dependency: str):
    """The dependency's record, read and written under a lock every worker shares."""
    if settings.REDIS_URL:
        client = _redis(settings.REDIS_URL)
        key = f"stepwise:quota:{dependency}"
        with client.lock(f"{key}:lock", timeout=LOCK_WAIT_S, blocking_timeout=LOCK_WAIT_S):
            yield _Store(lambda: json.loads(client.get(key) or b"{}"),
                         lambda state: client.set(key, json.dumps(state), ex=3600))
        return
    folder = Path(settings.VAR_DIR) / "quotas"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dependency.replace('/', '_').replace(':', '_')}.json"
    with open(folder / f"{path.stem}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            def write(state: dict) -> None:
                part = path.with_suffix(f".{os.getpid()}.part")
                part.write_text(json.dumps(state))
                part.replace(path)

            yield _Store(lambda: json.loads(path.read_text()) if path.exists() else {}, write)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@cache
def _redis(url: str):
    import redis  # the production cache's client, installed with the server

    return redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5)
