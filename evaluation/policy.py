"""A workflow's release policy, and whether an evaluation's summary meets it.

    {"tiers": {"high": {"unauthorized_actions": {"max": 0},
                        "action_accuracy": {"min": 0.98},
                        "max_regression": 0.01},
               "overall": {"pass_rate": {"min": 0.9, "bound": "ci"}}}}

Per tier (`low`, `medium`, `high`, `overall`), thresholds on metrics of the summary
(`evaluation.summary.summarize`): `min` and `max` on the figure's value (or, with
`"bound": "ci"`, on its 95% interval's far end: a minimum on the interval's low end, a maximum
on its high end), and `max_regression`: how far a figure may move the wrong way against the
published version's evaluation of the same dataset (a tier's own `max_regression` holds every
proportion metric of the tier to it; a metric's own holds that metric, of any kind). A metric
the policy names that the evaluation did not measure fails: a gate passes on evidence only.

Pure: `gate_check` returns the failures, [] when the summary passes; who may publish or
override is the service's (docs/evaluation-scoring.md, "Release policy").
"""
from jsonschema import Draft202012Validator

from orchestrator.engine.definitions.problems import format_path

from .metrics import LOWER, NEUTRAL, OVERALL, PROPORTION, TIERS, is_known, metric_of

TIER_NAMES = (*TIERS, OVERALL)
METRIC_NAME = r"^[a-z][a-z0-9_]*(:[a-z][a-z0-9_]*)?$"
#: Regressions smaller than this are rounding (summaries keep six places).
EPSILON = 1e-9

THRESHOLD_SCHEMA = {
    "type": "object", "additionalProperties": False, "minProperties": 1,
    "description": "Thresholds on one metric's figure.",
    "properties": {
        "min": {"type": "number", "description": "The least value that passes."},
        "max": {"type": "number", "description": "The greatest value that passes."},
        "max_regression": {"type": "number", "minimum": 0,
                           "description": "How far the value may move the wrong way against the baseline."},
        "bound": {"enum": ["value", "ci"], "description": "Hold min/max to the value (default) or to the "
                                                          "95% interval's far end."},
    },
}
TIER_SCHEMA = {
    "type": "object", "minProperties": 1, "propertyNames": {"pattern": METRIC_NAME},
    "description": "A tier's thresholds by metric name, and max_regression for all its proportions.",
    "properties": {"max_regression": {"type": "number", "minimum": 0, "maximum": 1}},
    "additionalProperties": THRESHOLD_SCHEMA,
}
POLICY_SCHEMA = {
    "description": "A workflow's release policy: thresholds per risk tier (docs/evaluation-scoring.md).",
    "type": "object", "additionalProperties": False, "required": ["tiers"],
    "properties": {"tiers": {"type": "object", "minProperties": 1, "additionalProperties": False,
                             "properties": {tier: TIER_SCHEMA for tier in TIER_NAMES}}},
}
_VALIDATOR = Draft202012Validator(POLICY_SCHEMA)


def policy_problems(policy: object, *, definition: dict | None = None, at: tuple = ()) -> list[dict]:
    """Every way `policy` is not a release policy, as [{"path", "message"}] with paths under
    `at`: its shape, metric names no summary has, a threshold that says nothing or cannot be
    met (min above max, a proportion's bound outside 0..1) and, given the workflow's
    normalized `definition`, a per-step metric of a step it does not have."""
    problems = [{"path": format_path((*at, *error.absolute_path)), "message": error.message}
                for error in sorted(_VALIDATOR.iter_errors(policy), key=lambda e: list(e.absolute_path))]
    if problems:
        return problems
    steps = {step["name"] for step in definition["steps"]} if definition is not None else None
    for tier, rules in policy["tiers"].items():
        for name, threshold in rules.items():
            if name == "max_regression":
                continue
            where = (*at, "tiers", tier, name)
            problem = _threshold_problem(name, threshold, steps)
            if problem:
                problems.append({"path": format_path(where), "message": problem})
    return problems


def _threshold_problem(name: str, threshold: dict, steps: set | None) -> str:
    if not is_known(name):
        return (f"'{name}' is not a metric a summary has (docs/evaluation-scoring.md lists them; "
                f"a per-step metric is named like action:<step>)")
    base, _, step = name.partition(":")
    if step and base != "scorer" and steps is not None and step not in steps:
        return f"the workflow has no step '{step}'"
    if not {"min", "max", "max_regression"} & set(threshold):
        return "a threshold needs min, max or max_regression"
    if "min" in threshold and "max" in threshold and threshold["min"] > threshold["max"]:
        return f"min {threshold['min']} is above max {threshold['max']}: nothing passes"
    if base != "scorer" and metric_of(name).kind == PROPORTION and any(not 0 <= threshold[key] <= 1
                                                  for key in ("min", "max", "max_regression") if key in threshold):
        return f"'{name}' is a proportion: its thresholds are between 0 and 1"
    return ""


def gate_check(summary: dict, policy: dict, *, baseline_summary: dict | None = None) -> list[dict]:
    """The ways `summary` fails `policy`: [{"tier", "metric", "kind" (min | max | regression |
    missing), "threshold", "value", "message"}, ...] (a regression also has "baseline"); []
    when it passes. `baseline_summary` is the published version's summary on the same
    dataset; without it no regression is checked. `policy` must be valid (`policy_problems`)."""
    failures = []
    for tier, rules in policy["tiers"].items():
        figures = (summary.get(tier) or {}).get("metrics") or {}
        baseline = ((baseline_summary or {}).get(tier) or {}).get("metrics") or {}
        for name, threshold in rules.items():
            if name == "max_regression":
                continue
            failures += _bounds(tier, name, threshold, figures.get(name), summary.get(tier))
        if baseline_summary is not None:
            failures += _regressions(tier, rules, figures, baseline)
    return failures


def _bounds(tier: str, name: str, threshold: dict, figure: dict | None, counts: dict | None) -> list[dict]:
    limits = [key for key in ("min", "max") if key in threshold]
    if not limits:
        return []
    if figure is None or figure.get("value") is None:
        why = ("the evaluation has no case of this tier" if not (counts or {}).get("cases")
               else "no case of the tier measured it")
        return [{"tier": tier, "metric": name, "kind": "missing", "threshold": {k: threshold[k] for k in limits},
                 "value": None, "message": f"{tier}: {name} was not measured ({why})"}]
    failures = []
    by_ci = threshold.get("bound") == "ci" and figure.get("ci") is not None
    for key in limits:
        value = figure["ci"][0 if key == "min" else 1] if by_ci else figure["value"]
        if (value < threshold[key]) if key == "min" else (value > threshold[key]):
            what = (f"its 95% interval's {'low' if key == 'min' else 'high'} end {_shown(value)}" if by_ci
                    else _shown(value))
            side = "below the minimum" if key == "min" else "above the maximum"
            failures.append({"tier": tier, "metric": name, "kind": key, "threshold": threshold[key], "value": value,
                             "message": f"{tier}: {name} is {what}, {side} {_shown(threshold[key])}"})
    return failures


def _regressions(tier: str, rules: dict, figures: dict, baseline: dict) -> list[dict]:
    failures = []
    for name in sorted(set(figures) & set(baseline)):
        own = rules.get(name) if isinstance(rules.get(name), dict) else {}
        if "max_regression" in own:
            allowed = own["max_regression"]
        elif "max_regression" in rules and figures[name].get("kind") == PROPORTION:
            allowed = rules["max_regression"]
        else:
            continue
        metric = metric_of(name)
        now, before = figures[name].get("value"), baseline[name].get("value")
        if metric.better == NEUTRAL or now is None or before is None:
            continue
        worse = (now - before) if metric.better == LOWER else (before - now)
        if worse > allowed + EPSILON:
            proportion = figures[name].get("kind") == PROPORTION
            moved = "rose" if metric.better == LOWER else "fell"
            amount = f"{worse * 100:.1f} points" if proportion else f"by {_shown(worse)}"
            limit = f"{allowed * 100:.1f}" if proportion else _shown(allowed)
            failures.append({
                "tier": tier, "metric": name, "kind": "regression", "threshold": allowed, "value": now,
                "baseline": before,
                "message": f"{tier}: {name} {moved} {amount} from the published version's {_shown(before)} "
                           f"to {_shown(now)} (at most {limit} allowed)"})
    return failures


def _shown(value: float) -> str:
    return f"{value:.6g}"
