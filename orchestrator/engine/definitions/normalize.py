"""Normalization: a valid definition with every default written out.

Owns `normalize_definition`, so the scheduler and executors read fields directly instead
of repeating defaults with `.get(..., default)`. The defaults themselves are declared in
`format.py` (and published in the format schema). It must only be called on a definition
that `validate_definition` accepted, and must not change any value the author wrote.
"""

from __future__ import annotations

import copy

from .format import (
    DEFAULT_ACTION_TIER,
    DEFAULT_APPROVAL_AT,
    DEFAULT_AUDIT_STORE,
    DEFAULT_EARLY_SIGNALS,
    DEFAULT_INPUT_DEADLINE_S,
    DEFAULT_INPUT_TIMEOUT,
    DEFAULT_JOIN,
    DEFAULT_MAX_PARALLEL,
    DEFAULT_MERGE,
    DEFAULT_MIN_CONFIDENCE,
    DEFAULT_ON_DURATION,
    DEFAULT_ON_ERROR,
    DEFAULT_ON_TIMEOUT,
    DEFAULT_OUTSIDE_TIER,
    DEFAULT_REPAIR_ATTEMPTS,
    DEFAULT_SLEEP_TIMEZONE,
    DEFAULT_STRATEGY,
    DEFAULT_WAIT_TIMEOUT_S,
    RETRY_DEFAULTS,
    default_timeout_s,
)


def normalize_definition(doc: dict) -> dict:
    """Return a deep copy of valid `doc` with every default filled in.

    The result is itself a valid definition, and normalizing it again changes nothing.
    """
    result = copy.deepcopy(doc)
    result.setdefault("description", "")
    result.setdefault("on_error", DEFAULT_ON_ERROR)
    result.setdefault("max_parallel", DEFAULT_MAX_PARALLEL)
    budget = result.setdefault("budget", {})
    budget.setdefault("max_cost_usd", None)
    budget.setdefault("max_duration_s", None)
    budget.setdefault("on_duration", DEFAULT_ON_DURATION)
    audit = result.setdefault("audit", {})
    audit.setdefault("sensitive", [])
    audit.setdefault("store_prompts", DEFAULT_AUDIT_STORE)
    for step in result["steps"]:
        _fill_step(step)
    return result


def _fill_step(step: dict) -> None:
    step.setdefault("after", [])
    step.setdefault("when", None)
    step.setdefault("join", DEFAULT_JOIN)
    step.setdefault("fallback", None)
    if step["type"] == "sleep":
        step.setdefault("description", "")
        if "until" in step:
            step.setdefault("timezone", DEFAULT_SLEEP_TIMEZONE)
        return  # it runs nothing: no timeout_s or retry
    if step["type"] == "human_input":
        step.setdefault("description", "")
        step.setdefault("deadline_s", DEFAULT_INPUT_DEADLINE_S)
        step.setdefault("on_timeout", DEFAULT_INPUT_TIMEOUT)
        step.setdefault("allow_abstain", False)
        step.setdefault("separation_of_duties", False)
        step.setdefault("evidence", {})
        return  # a person answers it: no attempt to time out or retry
    if step["type"] == "wait":
        step.setdefault("description", "")
        step.setdefault("timeout_s", DEFAULT_WAIT_TIMEOUT_S)
        step.setdefault("on_timeout", DEFAULT_ON_TIMEOUT)
        step.setdefault("early_signals", DEFAULT_EARLY_SIGNALS)
        return  # it runs nothing: no retry
    _fill_body(step)
    if step["type"] == "router":
        step.setdefault("strategy", DEFAULT_STRATEGY)
        if step["strategy"] == "llm":
            step.setdefault("script", [])
    elif step["type"] == "agent" and "proposal" in step:
        _fill_proposal(step["proposal"])
    elif step["type"] == "map":
        step.setdefault("merge", DEFAULT_MERGE)
        _fill_body(step["item"])
    elif step["type"] == "sub_workflow":
        step.setdefault("input", {})
    elif step["type"] == "loop":
        step.setdefault("input", {})
        for body_step in step["body"]:
            _fill_step(body_step)


def _fill_body(body: dict) -> None:
    """Defaults shared by top-level steps and map items."""
    body.setdefault("description", "")
    body.setdefault("timeout_s", default_timeout_s(body["type"]))
    retry = body.setdefault("retry", {})
    for key, value in RETRY_DEFAULTS.items():
        retry.setdefault(key, copy.deepcopy(value))
    if body["type"] == "agent":
        body.setdefault("script", [])
        body.setdefault("repair_attempts", DEFAULT_REPAIR_ATTEMPTS)
    elif body["type"] == "tool":
        body.setdefault("params", {})
        body.setdefault("side_effect", False)
        if "compensate" in body:
            body["compensate"].setdefault("params", {})
            # Undoing calls the same remote as doing: by default it retries the same way.
            compensation_retry = body["compensate"].setdefault("retry", copy.deepcopy(retry))
            for key, value in retry.items():
                compensation_retry.setdefault(key, copy.deepcopy(value))


def _fill_proposal(proposal: dict) -> None:
    proposal.setdefault("approval_at", DEFAULT_APPROVAL_AT)
    proposal.setdefault("min_confidence", DEFAULT_MIN_CONFIDENCE)
    for action in proposal["actions"]:
        action.setdefault("description", "")
        risk = action.setdefault("risk", {})
        risk.setdefault("tier", DEFAULT_ACTION_TIER)
        risk.setdefault("rules", [])
        if "recipient" in risk:
            risk["recipient"].setdefault("outside", DEFAULT_OUTSIDE_TIER)
