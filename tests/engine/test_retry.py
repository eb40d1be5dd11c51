"""Retry decisions for every error class and backoff strategy (table-driven)."""
import random
from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.engine.retry import StepError, backoff_s, retry_at

AT = datetime(2026, 1, 1, tzinfo=UTC)
POLICY = {"max_attempts": 3, "backoff": "exponential", "base_s": 2, "max_s": 60, "jitter": False,
          "retry_on": ["timeout", "rate_limit", "transient"]}


@pytest.mark.parametrize("backoff, attempts, expected", [
    ("exponential", [0, 1, 2, 3, 10], [2, 4, 8, 16, 60]),
    ("linear", [0, 1, 2, 40], [2, 4, 6, 60]),
    ("fixed", [0, 5], [2, 2]),
])
def test_backoff_follows_the_strategy_and_is_capped(backoff, attempts, expected):
    policy = {**POLICY, "backoff": backoff}
    assert [backoff_s(policy, n) for n in attempts] == expected


def test_jitter_adds_at_most_one_base_delay():
    policy = {**POLICY, "jitter": True}
    delays = [backoff_s(policy, 1, rng=random.Random(seed)) for seed in range(50)]
    assert all(4 <= d <= 6 for d in delays) and len(set(delays)) > 1


@pytest.mark.parametrize("error_class, retried", [
    ("timeout", True), ("rate_limit", True), ("transient", True), ("lost", True),
    ("invalid_output", False),  # not in this policy's retry_on
    ("auth", False), ("policy", False), ("validation", False), ("permanent", False),
    ("invalid_request", False), ("rejected", False),
])
def test_only_listed_transient_classes_are_retried(error_class, retried):
    when = retry_at(POLICY, attempts=1, error=StepError(error_class, "x"), at=AT)
    assert (when is not None) is retried


def test_never_retried_classes_are_not_retried_even_when_listed():
    policy = {**POLICY, "retry_on": ["auth", "permanent", "transient"]}
    assert retry_at(policy, attempts=1, error=StepError("auth", "x"), at=AT) is None


def test_attempts_are_bounded():
    err = StepError("transient", "x")
    assert retry_at(POLICY, attempts=2, error=err, at=AT) == AT + timedelta(seconds=4)
    assert retry_at(POLICY, attempts=3, error=err, at=AT) is None


def test_retry_after_hint_is_respected_when_longer_than_backoff():
    err = StepError("rate_limit", "slow down", retry_after_s=30)
    assert retry_at(POLICY, attempts=1, error=err, at=AT) == AT + timedelta(seconds=30)


def test_a_lost_attempt_is_retried_without_a_policy_but_only_a_few_times():
    no_policy = {**POLICY, "max_attempts": 1, "retry_on": []}
    lost = StepError("lost", "worker died")
    assert retry_at(no_policy, attempts=1, error=lost, at=AT) is not None
    assert retry_at(no_policy, attempts=2, error=lost, at=AT) is not None
    assert retry_at(no_policy, attempts=3, error=lost, at=AT) is None  # poison: dead letter


def test_an_uncertain_effect_is_never_retried():
    assert retry_at(POLICY, attempts=1, error=StepError("uncertain", "x"), at=AT) is None
