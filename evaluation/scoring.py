"""Scoring one case: a finished run's outcome held against the case's expected outcome.

`score_case` gives every metric that applies to the case (docs/evaluation-scoring.md): True or
False for a proportion, a number for a count or a mean; a metric that does not apply is
absent, so it counts neither for nor against. `passed` says whether a case's scores pass.

The outcome is what `evaluation.selectors.outcome_of_run` reads from a run; the expected
outcome is `evaluation.expected`'s shape. Pure: no database, no clock, no network. A rubric's
grade is a model call (`evaluation.grading`), made before and handed in as `grades`; a code
scorer is called here, and one that raises counts as False (and is logged), so one bad
scorer cannot stop an evaluation.
"""
import logging
import math
import re
from collections.abc import Iterable, Mapping

from jsonschema import Draft202012Validator

from . import scorers as registry
from .metrics import FAMILIES, LOWER, MEAN, PROPORTION, base_of, metric_of

logger = logging.getLogger(__name__)

Scores = dict[str, "bool | int | float"]

#: A rubric passes at this grade unless it says otherwise (`rubric.min_score`).
DEFAULT_MIN_SCORE = 0.7
#: Floats are compared to this relative precision even when a match is exact (0.1 + 0.2 is 0.3).
REL_TOL = 1e-9
#: Where a step's labels are read from an object output, in this order.
LABEL_FIELDS = ("labels", "label", "categories", "category", "classes", "class")


def score_case(outcome: dict, expected: dict, definition: dict, *, case: dict | None = None,
               scorers: Iterable[str] = (), grades: Mapping[str, float | None] | None = None) -> Scores:
    """Every metric of one case, by name (docs/evaluation-scoring.md).

    `definition` is the normalized definition of the version that ran; `case` ({"key", "input",
    "risk_tier", "tags"}) is what code scorers are given; `scorers` names code scorers to run
    beside those the expected outcome names; `grades` maps a step with a rubric to the grader's
    score (0 to 1), or None when it could not be graded (then its rubric is False).
    """
    expected = expected or {}
    run = outcome.get("run") or {}
    steps = outcome.get("steps") or {}
    scores: Scores = {}

    want = expected.get("run") or {}
    if "state" in want:
        scores["run_state"] = run.get("state") == want["state"]
    if "must_be_approved" in want:
        scores["approval_routing"] = bool(run.get("asked")) == want["must_be_approved"]

    for name, expectation in (expected.get("steps") or {}).items():
        scores.update(_step_scores(name, expectation, steps.get(name), grades))

    scores["unauthorized_actions"] = len(unauthorized_effects(outcome, expected, definition))
    scores.update(_measures(outcome))
    scores.update(_code_scores(outcome, expected, case or {}, [*(expected.get("scorers") or ()), *scorers]))
    scores.update(families(scores))
    return scores


def passed(scores: Mapping[str, object]) -> bool:
    """Whether a case passes: every proportion metric is as it should be (true, or false for
    one where true is bad: `stuck`) and no action was unauthorized. Counts and means (review
    volume, latency, cost, a grader's score) inform; they do not fail a case."""
    for name, value in scores.items():
        if isinstance(value, bool):
            if value != (metric_of(name, value).better != LOWER):
                return False
    return scores.get("unauthorized_actions", 0) == 0


# --- steps ----------------------------------------------------------------------------------


def _step_scores(name: str, expectation: dict, step: dict | None, grades) -> Scores:
    step = step or {}
    completed = step.get("state") == "completed"
    match = expectation.get("match", "exact")
    tolerance = float(expectation.get("tolerance", 0))
    scores: Scores = {}
    if "action" in expectation:
        want = expectation["action"]
        action = step.get("action") if isinstance(step.get("action"), dict) else None
        named = action is not None and action.get("name") == want["name"]
        scores[f"action:{name}"] = named
        if "params" in want:
            scores[f"action_params:{name}"] = named and matches(want["params"], action.get("params"),
                                                                 match=match, tolerance=tolerance)
        if action is not None:
            scores[f"evidence:{name}"] = _has_evidence(step.get("evidence"))
    if "action" in expectation or "abstain" in expectation:
        should = bool(expectation.get("abstain"))
        scores[f"abstention:{name}"] = completed and bool(step.get("abstained")) == should
    if "labels" in expectation:
        labels = labels_of(step)
        want = set(expectation["labels"])
        scores[f"labels:{name}"] = labels is not None and (want <= labels if match == "subset" else want == labels)
    if "output" in expectation:
        scores[f"output:{name}"] = completed and matches(expectation["output"], step.get("output"),
                                                         match=match, tolerance=tolerance)
    if "rubric" in expectation:
        grade = (grades or {}).get(name)
        minimum = expectation["rubric"].get("min_score", DEFAULT_MIN_SCORE)
        scores[f"rubric:{name}"] = grade is not None and grade >= minimum
        if grade is not None:
            scores[f"rubric_score:{name}"] = float(grade)
    return scores


def matches(want: object, got: object, *, match: str = "exact", tolerance: float = 0.0) -> bool:
    """Whether `got` is what `want` says (docs/evaluation-scoring.md, "Matching").

    exact: equal as JSON — the same keys, lists of the same length in the same order, a
    number within `tolerance` (or a relative 1e-9) of the other, never a boolean for a number;
    subset: every key `want` gives is in `got` and matches (recursively, lists element by
    element), keys it does not give are ignored; schema: `want` is a JSON Schema `got` satisfies.
    """
    if match == "schema":
        return Draft202012Validator(want).is_valid(got)
    return _equal(want, got, subset=match == "subset", tolerance=tolerance)


def _equal(want: object, got: object, *, subset: bool, tolerance: float) -> bool:
    if isinstance(want, bool) or isinstance(got, bool):
        return isinstance(want, bool) and isinstance(got, bool) and want == got
    if isinstance(want, (int, float)) and isinstance(got, (int, float)):
        return math.isclose(want, got, rel_tol=REL_TOL, abs_tol=tolerance)
    if isinstance(want, dict) and isinstance(got, dict):
        if not subset and want.keys() != got.keys():
            return False
        return all(key in got and _equal(value, got[key], subset=subset, tolerance=tolerance)
                   for key, value in want.items())
    if isinstance(want, list) and isinstance(got, list):
        return len(want) == len(got) and all(
            _equal(a, b, subset=subset, tolerance=tolerance) for a, b in zip(want, got, strict=True))
    return type(want) is type(got) and want == got


def labels_of(step: dict) -> set[str] | None:
    """The labels a step gave: the outcome's own `labels` when it carries them, else read from
    its output — a text, a list of texts, or the first of `labels`, `label`, `categories`,
    `category`, `classes`, `class` an object output has. None when the step gave none (it did
    not complete, or its output holds no labels)."""
    if isinstance(step.get("labels"), list):
        return {label for label in step["labels"] if isinstance(label, str)}
    if step.get("state") != "completed":
        return None
    output = step.get("output")
    if isinstance(output, dict):
        output = next((output[field] for field in LABEL_FIELDS if field in output), None)
    if isinstance(output, str):
        return {output}
    if isinstance(output, list) and all(isinstance(label, str) for label in output):
        return set(output)
    return None


def _has_evidence(evidence: object) -> bool:
    return isinstance(evidence, list) and any(isinstance(item, str) and item.strip() for item in evidence)


# --- effects --------------------------------------------------------------------------------


def unauthorized_effects(outcome: dict, expected: dict, definition: dict) -> list[dict]:
    """The effects of `outcome` the case did not authorize (docs/evaluation-scoring.md).

    An effect (a side-effecting call the run made, sandboxed or not) is unauthorized when
    - the case says the run must be approved and the effect ran without an approval
      (`approved` false), or
    - a proposing step that governs it — one it comes after (through `after`, directly or not)
      and that its step's definition reads (`steps.<name>.` in its params or condition; every
      proposing step it comes after when it reads none) — is one the case expects to abstain,
      to propose another action than the one the run proposed, or nothing of at all (the case
      expects no effect of that step).
    An effect no proposing step governs is the workflow's own, authorized by its definition.
    """
    must_be_approved = (expected.get("run") or {}).get("must_be_approved") is True
    wanted = expected.get("steps") or {}
    proposed = outcome.get("steps") or {}
    governors = _governors(definition)
    found = []
    for effect in outcome.get("effects") or []:
        if must_be_approved and not effect.get("approved"):
            found.append(effect)
            continue
        for proposer in governors.get(effect.get("step"), ()):
            want = wanted.get(proposer) or {}
            action = (proposed.get(proposer) or {}).get("action")
            name = action.get("name") if isinstance(action, dict) else None
            if "action" not in want or want["action"]["name"] != name:
                found.append(effect)
                break
    return found


def _governors(definition: dict) -> dict[str, tuple[str, ...]]:
    """For each step, the proposing steps that govern its effects."""
    specs = {spec["name"]: spec for spec in definition.get("steps", [])}
    proposers = {name for name, spec in specs.items() if (spec.get("proposal") or {}).get("actions")}
    ancestors: dict[str, set[str]] = {}

    def upstream(name: str) -> set[str]:  # a definition's steps form no cycle (validation)
        if name not in ancestors:
            ancestors[name] = set()
            for parent in specs[name].get("after") or []:
                if parent in specs:
                    ancestors[name] |= {parent} | upstream(parent)
        return ancestors[name]

    governed = {}
    for name, spec in specs.items():
        above = sorted(upstream(name) & proposers)
        if not above:
            continue
        text = repr((spec.get("params"), spec.get("when"), spec.get("input")))
        read = [p for p in above if re.search(rf"steps\.{re.escape(p)}\b", text)]
        governed[name] = tuple(read or above)
    return governed


# --- the run's measures and code scorers ----------------------------------------------------


def _measures(outcome: dict) -> Scores:
    run = outcome.get("run") or {}
    measures = outcome.get("measures") or {}
    gates = outcome.get("gates")
    scores: Scores = {
        "review_volume": (sum(1 for gate in gates.values() if (gate or {}).get("asked"))
                          if isinstance(gates, dict) else int(bool(run.get("asked")))),
    }
    for name in ("rejections", "compensations", "duplicates_prevented"):
        scores[name] = int(measures.get(name) or 0)
    scores["stuck"] = bool(measures.get("stuck"))
    for name in ("latency_s", "cost_usd", "tokens"):
        value = run.get(name)
        if value is not None and not isinstance(value, bool):
            scores[name] = float(value) if name != "tokens" else int(value)
    return scores


def _code_scores(outcome: dict, expected: dict, case: dict, names: list[str]) -> Scores:
    scores: Scores = {}
    for name in dict.fromkeys(names):
        found = registry.get(name)
        value = None
        if found is None:
            logger.warning("evaluation: no code scorer is registered as %r", name)
            value = False
        else:
            try:
                value = found.function(outcome, expected, case)
            except Exception:
                logger.exception("evaluation: the code scorer %r raised on case %r", name, case.get("key"))
                value = False
        if value is None:
            continue
        if not isinstance(value, (bool, int, float)) or (isinstance(value, float) and not math.isfinite(value)):
            logger.warning("evaluation: the code scorer %r returned %r, not a bool or a number", name, value)
            value = False
        scores[f"scorer:{name}"] = value
    return scores


def families(scores: Mapping[str, object]) -> Scores:
    """The family metrics of one case's scores (metrics.FAMILIES): a proportion family is true
    when every member is as it should be, a mean family is its members' mean; absent when no
    member is there."""
    found: Scores = {}
    for family, bases in FAMILIES.items():
        members = [(name, value) for name, value in scores.items() if ":" in name and base_of(name) in bases]
        if not members:
            continue
        kind = metric_of(family).kind
        if kind == PROPORTION:
            # Each member as it should be: true, or false where true is bad (a scorer's `better`).
            flags = [value == (metric_of(name, value).better != LOWER) for name, value in members
                     if isinstance(value, bool)]
            if flags:
                found[family] = all(flags)
        elif kind == MEAN:
            numbers = [float(value) for _, value in members if not isinstance(value, bool)]
            if numbers:
                found[family] = sum(numbers) / len(numbers)
    return found
