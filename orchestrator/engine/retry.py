"""Retry decisions: a pure function of (policy, attempts so far, error) -> retry at / give up.

Error classes (the vocabulary of every executor, provider and tool):
retryable when the policy lists them: timeout, rate_limit, transient, invalid_output;
`lost` (the worker died mid-step) is retried up to LOST_ATTEMPTS_ALLOWED attempts whatever the
policy; never retried: auth, policy, validation, permanent, invalid_request, rejected,
cancelled, budget, uncertain (an effect that may have happened needs a person), stale (the
attempt's claim was superseded: its fencing token is old, and a newer attempt owns the step).
"""
import random
from dataclasses import dataclass
from datetime import datetime, timedelta

NEVER_RETRIED = frozenset({"auth", "policy", "validation", "permanent", "invalid_request",
                           "rejected", "cancelled", "budget", "uncertain", "stale"})
LOST_ATTEMPTS_ALLOWED = 3
ERROR_CLASSES = frozenset({"timeout", "rate_limit", "transient", "invalid_output", "lost"}) | NEVER_RETRIED


@dataclass(eq=False)  # not frozen: Python sets __traceback__ on exceptions it re-raises
class StepError(Exception):
    """Raised by executors: a classified failure of one attempt."""

    error_class: str
    message: str
    retry_after_s: float | None = None

    def __str__(self) -> str:
        return f"{self.error_class}: {self.message}"

    def as_dict(self) -> dict:
        return {"class": self.error_class, "message": self.message}


def backoff_s(policy: dict, attempt: int, *, rng: random.Random | None = None) -> float:
    """Delay before retry number `attempt` (0-based): exponential, linear or fixed, capped.

    Jitter adds up to one base delay, so simultaneous failures do not retry in lockstep.
    """
    base, cap = float(policy["base_s"]), float(policy["max_s"])
    if policy["backoff"] == "exponential":
        delay = min(base * 2**attempt, cap)
    elif policy["backoff"] == "linear":
        delay = min(base * (attempt + 1), cap)
    else:
        delay = min(base, cap)
    if policy["jitter"] and base > 0:
        delay += (rng or random).uniform(0, base)
    return delay


def retry_at(policy: dict, *, attempts: int, error: StepError, at: datetime,
             rng: random.Random | None = None) -> datetime | None:
    """When to try again after `attempts` attempts ended in `error`, or None to give up."""
    if error.error_class in NEVER_RETRIED:
        return None
    if error.error_class == "lost":
        # The worker died, not the step: retry even a step without a retry policy, but only
        # a few times, so a message that kills every worker (poison) ends in the dead letters.
        if attempts >= max(policy["max_attempts"], LOST_ATTEMPTS_ALLOWED):
            return None
    elif error.error_class not in policy["retry_on"] or attempts >= policy["max_attempts"]:
        return None
    delay = backoff_s(policy, attempts - 1, rng=rng)
    if error.retry_after_s is not None:
        delay = max(delay, error.retry_after_s)
    return at + timedelta(seconds=delay)
