"""Risk tiers: deterministic rules over a validated proposal decide whether a person approves.

`assess` is a pure function of (the action's declared risk rules, the proposal, the step
input, what validation found) -> {tier, reasons, requires_approval}. The model cannot
choose its tier or the approval: its output is only the data the rules read, and the only
model signal used (its stated confidence) can raise the tier, never lower it.

Tiers, lowest first: low < medium < high < critical. The tier is the highest of:

* the action type's declared `tier` (default low);
* `amount`: the param's value against the declared thresholds (>= `medium`/`high`/`critical`);
  a missing or non-numeric amount is `high`;
* `recipient`: every value of the param must be in `allowed` (an exact value, or the domain
  of an email address or the host of a URL); anything else, or nothing, is `outside`
  (default high);
* `rules`: each CEL expression over {input, steps, proposal} that holds gives its tier; one
  that cannot be evaluated, or is not a boolean, gives critical;
* validation findings: no evidence, or a reply that needed repairs, is at least medium;
* confidence below the declaration's `min_confidence` is at least high.

`requires_approval` is tier >= the declaration's `approval_at` (default medium); critical
therefore always requires approval.
"""
from dataclasses import dataclass
from urllib.parse import urlsplit

from .definitions.expressions import ExpressionError, evaluate_expression
from .definitions.format import (
    DEFAULT_ACTION_TIER,
    DEFAULT_APPROVAL_AT,
    DEFAULT_MIN_CONFIDENCE,
    DEFAULT_OUTSIDE_TIER,
)
from .definitions.format import RISK_TIERS as TIERS

RANK = {tier: rank for rank, tier in enumerate(TIERS)}


@dataclass(frozen=True)
class Risk:
    tier: str
    reasons: tuple[str, ...]
    requires_approval: bool

    def as_dict(self) -> dict:
        return {"tier": self.tier, "reasons": list(self.reasons),
                "requires_approval": self.requires_approval}


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _amount_findings(rule: dict, params: dict) -> list[tuple[str, str]]:
    name = rule["param"]
    amount = params.get(name)
    if not _is_number(amount):
        return [("high", f"{name} is missing or not a number, so the amount cannot be assessed")]
    found = [(tier, f"{name} {amount} >= {rule[tier]} ({tier} threshold)")
             for tier in ("medium", "high", "critical")
             if _is_number(rule.get(tier)) and amount >= rule[tier]]
    return found[-1:]  # the highest threshold reached explains the tier


def in_scope(value: object, allowed: list[str]) -> bool:
    """Whether one recipient is in scope: an allowed value, or its email domain / URL host."""
    if not isinstance(value, str) or not value.strip():
        return False
    text = value.strip().lower()
    # A blank entry allows nothing: it must not match a URL without a host or an address
    # without a domain.
    entries = {entry.strip().lower() for entry in allowed if entry.strip()}
    if text in entries:
        return True
    if "://" in text:
        host = urlsplit(text).hostname or ""
        return host in entries
    if text.count("@") == 1:
        return text.rsplit("@", 1)[1] in entries
    return False


def _recipient_findings(rule: dict, params: dict) -> list[tuple[str, str]]:
    name, outside = rule["param"], rule.get("outside", DEFAULT_OUTSIDE_TIER)
    value = params.get(name)
    values = value if isinstance(value, list) else [value]
    if value is None or not values:
        return [(outside, f"{name} is missing, so the recipient scope cannot be checked")]
    strangers = [v for v in values if not in_scope(v, rule.get("allowed", []))]
    if strangers:
        shown = ", ".join(repr(v) for v in strangers[:5])
        return [(outside, f"{name} {shown} is outside the allowed recipients")]
    return []


def _rule_findings(rules: list[dict], context: dict) -> list[tuple[str, str]]:
    found = []
    for rule in rules:
        try:
            holds = evaluate_expression(rule["when"], context)
        except ExpressionError as exc:
            found.append(("critical", f"rule {rule['when']!r} could not be evaluated: {exc}"))
            continue
        if holds is True:
            found.append((rule["tier"], rule.get("reason") or f"rule {rule['when']!r} holds"))
        elif holds is not False:
            found.append(("critical", f"rule {rule['when']!r} gave {holds!r}, not a boolean"))
    return found


def assess(*, declaration: dict, proposal: dict, step_input: dict, repairs: int = 0) -> Risk:
    """The risk of a validated, normalized `proposal` under the step's `declaration`.

    `declaration` is the step's `proposal` block; `step_input` is {input, steps}; `repairs`
    is how many repair turns the reply needed. Never raises for a validated proposal.
    """
    action = next(a for a in declaration["actions"] if a["type"] == proposal["action_type"])
    rules = action.get("risk") or {}
    params = proposal["params"]
    base = rules.get("tier", DEFAULT_ACTION_TIER)
    findings: list[tuple[str, str]] = [(base, f"action {action['type']!r} is {base} risk")]
    if rules.get("amount"):
        findings += _amount_findings(rules["amount"], params)
    if rules.get("recipient"):
        findings += _recipient_findings(rules["recipient"], params)
    findings += _rule_findings(rules.get("rules", []),
                               {**step_input, "proposal": proposal})
    if not proposal.get("evidence"):
        findings.append(("medium", "the proposal cites no evidence"))
    if repairs:
        findings.append(("medium", f"the reply needed {repairs} repair(s) to pass validation"))
    minimum = declaration.get("min_confidence", DEFAULT_MIN_CONFIDENCE)
    confidence = proposal.get("confidence")
    if not _is_number(confidence) or confidence < minimum:
        findings.append(("high", f"model confidence {confidence!r} is below {minimum}"))
    tier = max((t for t, _ in findings), key=RANK.__getitem__)
    reasons = tuple(reason for _, reason in findings)
    approval_at = declaration.get("approval_at", DEFAULT_APPROVAL_AT)
    return Risk(tier, reasons, RANK[tier] >= RANK[approval_at])
