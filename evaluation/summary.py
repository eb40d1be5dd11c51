"""An evaluation's results summarised by risk tier, and two evaluations of a dataset compared.

A result is one case's verdict: {"case": key, "risk_tier": "low" | "medium" | "high",
"scores": {...} (scoring.score_case), "passed": bool}. `summarize` gives every metric per tier
and overall with a 95% interval (docs/evaluation-scoring.md, "Summaries"); `compare` gives the
cases whose outcome changed between two evaluations, metric by metric, and the tiers' deltas.
Pure: results in, plain JSON out.
"""
from collections.abc import Iterable, Sequence

from .intervals import mean_interval, wilson
from .metrics import (
    COUNT,
    FAMILY_METRICS,
    LOWER,
    MEAN,
    NEUTRAL,
    OVERALL,
    PASS_RATE,
    PROPORTION,
    TIERS,
    metric_of,
)

#: Decimal places of a summary's figures: enough for a cost per case, stable to compare.
PLACES = 6


def summarize(results: Iterable[dict]) -> dict:
    """{"low" | "medium" | "high" | "overall": {"cases", "passed", "metrics": {name: figure}}}.

    A figure is {"kind", "n": cases the metric applied to, "value", "ci": [low, high] or None}:
    for a proportion (every value True/False) the share of True with Wilson's interval;
    otherwise (kind "count" or "mean") the mean with Student's t interval (None under two
    cases), and for a count also its "total".
    `pass_rate` is the share of cases that passed. A tier without cases has no metrics.
    """
    results = list(results)
    by_tier = {tier: [r for r in results if r.get("risk_tier") == tier] for tier in TIERS}
    by_tier[OVERALL] = results
    return {tier: _tier(cases) for tier, cases in by_tier.items()}


def _tier(results: Sequence[dict]) -> dict:
    values: dict[str, list] = {}
    for result in results:
        for name, value in (result.get("scores") or {}).items():
            if value is not None:
                values.setdefault(name, []).append(value)
    metrics = {name: figure(name, values[name]) for name in sorted(values)}
    if results:
        metrics[PASS_RATE] = figure(PASS_RATE, [bool(r.get("passed")) for r in results])
    return {"cases": len(results), "passed": sum(1 for r in results if r.get("passed")), "metrics": metrics}


def figure(name: str, values: Sequence) -> dict:
    """One metric's figure over `values` (see `summarize`)."""
    n = len(values)
    if n and all(isinstance(value, bool) for value in values):
        successes = sum(values)
        interval = wilson(successes, n)
        return {"kind": PROPORTION, "n": n, "value": _round(successes / n), "ci": _pair(interval)}
    numbers = [float(value) for value in values]
    found = mean_interval(numbers)
    count = metric_of(name, values[0] if values else None).kind == COUNT
    shown = {"kind": COUNT if count else MEAN, "n": n, "value": _round(found[0]) if found else None,
             "ci": _pair(found[1]) if found else None}
    if count:
        shown["total"] = _round(sum(numbers))
    return shown


def compare(base_results: Iterable[dict], new_results: Iterable[dict]) -> dict:
    """Two evaluations of the same dataset, case by case and tier by tier.

    "changed": each case (in both) and metric whose value differs, with the direction (better
    or worse) — proportions, counts and `passed`; families (derived from the per-step metrics
    shown beside them), neutral metrics and continuous means (latency, cost: they differ on
    every run) are left to the tiers. "tiers": every metric of either side's summary per tier,
    base, new and delta (new - base; None when one side lacks it), computed over the cases both
    evaluated, so a partial evaluation is held to the same cases. "only_in_base" and
    "only_in_new": the case keys one side lacks.
    """
    base = {r["case"]: r for r in base_results}
    new = {r["case"]: r for r in new_results}
    common = [key for key in new if key in base]
    changed = []
    for key in common:
        before, after = base[key], new[key]
        pairs = [(name, before["scores"][name], after["scores"][name])
                 for name in after.get("scores") or {} if name in (before.get("scores") or {})]
        pairs.append(("passed", bool(before.get("passed")), bool(after.get("passed"))))
        for name, old, now in pairs:
            direction = _direction(name, old, now)
            if direction:
                changed.append({"case": key, "risk_tier": after.get("risk_tier"), "metric": name,
                                "base": old, "new": now, "direction": direction})
    before_summary = summarize(base[key] for key in common)
    after_summary = summarize(new[key] for key in common)
    tiers = {}
    for tier in (*TIERS, OVERALL):
        old_metrics = before_summary[tier]["metrics"]
        new_metrics = after_summary[tier]["metrics"]
        tiers[tier] = {}
        for name in sorted({*old_metrics, *new_metrics}):
            old = old_metrics.get(name, {}).get("value")
            now = new_metrics.get(name, {}).get("value")
            tiers[tier][name] = {"base": old, "new": now,
                                 "delta": _round(now - old) if old is not None and now is not None else None}
    return {"changed": changed, "tiers": tiers,
            "only_in_base": [key for key in base if key not in new],
            "only_in_new": [key for key in new if key not in base]}


def _direction(name: str, old: object, now: object) -> str | None:
    """"better" or "worse" for a value that changed and is compared case by case, else None."""
    if name in FAMILY_METRICS or old is None or now is None:
        return None
    metric = metric_of(name, now)
    if metric.better == NEUTRAL or (metric.kind == MEAN and not isinstance(now, bool)):
        return None
    if isinstance(old, bool) != isinstance(now, bool) or old == now:
        return None
    higher = now > old
    return "better" if higher == (metric.better != LOWER) else "worse"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, PLACES)


def _pair(interval: tuple[float, float] | None) -> list[float] | None:
    return None if interval is None else [_round(interval[0]), _round(interval[1])]
