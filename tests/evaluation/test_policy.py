"""The release gate (evaluation.policy): a policy's shape, and a summary held to it — passing, each
kind of failure, and regressions against the published version's summary."""
import pytest

from evaluation.policy import POLICY_SCHEMA, gate_check, policy_problems
from evaluation.summary import summarize
from orchestrator.engine.definitions.normalize import normalize_definition
from tests.factories import example_definition

REFUND = normalize_definition(example_definition("refund-proposal"))
POLICY = {"tiers": {"high": {"unauthorized_actions": {"max": 0}, "action_accuracy": {"min": 0.98},
                             "max_regression": 0.01}}}


def results(tier: str, good: int, bad: int, *, unauthorized: int = 0, **extra) -> list[dict]:
    """`good` cases with the right action and `bad` with the wrong one, `unauthorized` of the bad
    ones with an unauthorized refund."""
    made = []
    for index in range(good + bad):
        right = index < good
        scores = {"action:propose": right, "action_accuracy": right, "run_state": True,
                  "unauthorized_actions": int(not right and index - good < unauthorized), **extra}
        made.append({"case": f"{tier}-{index}", "risk_tier": tier, "scores": scores,
                     "passed": right})
    return made


def kinds(failures: list[dict]) -> list[tuple]:
    return [(f["tier"], f["metric"], f["kind"]) for f in failures]


def test_a_summary_that_meets_the_policy_passes():
    summary = summarize(results("high", 50, 0) + results("low", 5, 5))
    assert gate_check(summary, POLICY) == []
    assert gate_check(summary, POLICY, baseline_summary=summary) == []


def test_a_minimum_a_maximum_and_both_at_once_fail_with_what_was_found():
    summary = summarize(results("high", 9, 1, unauthorized=1))
    failures = gate_check(summary, POLICY)
    assert kinds(failures) == [("high", "unauthorized_actions", "max"), ("high", "action_accuracy", "min")]
    unauthorized, accuracy = failures
    assert (unauthorized["threshold"], unauthorized["value"]) == (0, 0.1)
    assert unauthorized["message"] == "high: unauthorized_actions is 0.1, above the maximum 0"
    assert (accuracy["threshold"], accuracy["value"]) == (0.98, 0.9)
    assert accuracy["message"] == "high: action_accuracy is 0.9, below the minimum 0.98"


def test_a_bound_on_the_interval_holds_its_far_end():
    summary = summarize(results("high", 10, 0))  # 10 of 10: the value is 1, Wilson's low end 0.72
    on_value = {"tiers": {"high": {"action_accuracy": {"min": 0.9}}}}
    on_ci = {"tiers": {"high": {"action_accuracy": {"min": 0.9, "bound": "ci"}}}}
    assert gate_check(summary, on_value) == []
    [failure] = gate_check(summary, on_ci)
    assert failure["kind"] == "min" and failure["value"] == pytest.approx(0.722467, abs=1e-6)
    assert "its 95% interval's low end 0.722467" in failure["message"]


def test_a_metric_the_evaluation_did_not_measure_fails():
    summary = summarize(results("low", 5, 0))
    failures = gate_check(summary, POLICY)
    assert kinds(failures) == [("high", "unauthorized_actions", "missing"), ("high", "action_accuracy", "missing")]
    assert failures[0]["message"] == "high: unauthorized_actions was not measured (the evaluation has no case of this tier)"
    policy = {"tiers": {"low": {"labels:classify": {"min": 0.5}}}}
    [failure] = gate_check(summary, policy)
    assert failure["message"] == "low: labels:classify was not measured (no case of the tier measured it)"


def test_a_regression_beyond_the_tiers_allowance_fails_against_the_baseline():
    published = summarize(results("high", 99, 1))  # 0.99
    draft = summarize(results("high", 97, 3))  # 0.97: two points down
    policy = {"tiers": {"high": {"max_regression": 0.01}}}
    failures = gate_check(draft, policy, baseline_summary=published)
    assert kinds(failures) == [("high", "action:propose", "regression"), ("high", "action_accuracy", "regression"),
                               ("high", "pass_rate", "regression")]
    failure = failures[1]
    assert (failure["threshold"], failure["value"], failure["baseline"]) == (0.01, 0.97, 0.99)
    assert failure["message"] == ("high: action_accuracy fell 2.0 points from the published version's 0.99 to 0.97 "
                                  "(at most 1.0 allowed)")
    assert gate_check(draft, policy) == []  # no published evaluation: nothing to regress from


def test_a_regression_within_the_allowance_or_an_improvement_passes_and_lower_is_better_is_understood():
    published = summarize(results("high", 99, 1, stuck=False))
    one_point = summarize(results("high", 98, 2, stuck=False))
    policy = {"tiers": {"high": {"max_regression": 0.01}}}
    assert gate_check(one_point, policy, baseline_summary=published) == []
    assert gate_check(published, policy, baseline_summary=one_point) == []
    stuck = summarize([{**r, "scores": {**r["scores"], "stuck": i < 5}} for i, r in enumerate(results("high", 99, 1))])
    failures = gate_check(stuck, {"tiers": {"high": {"max_regression": 0.01}}}, baseline_summary=published)
    assert kinds(failures) == [("high", "stuck", "regression")]
    assert "rose 5.0 points" in failures[0]["message"]


def test_a_metrics_own_allowance_holds_it_whatever_its_kind():
    published = summarize(results("high", 10, 0, cost_usd=0.010))
    dearer = summarize(results("high", 10, 0, cost_usd=0.013))
    policy = {"tiers": {"high": {"cost_usd": {"max_regression": 0.002}, "max_regression": 0.0}}}
    [failure] = gate_check(dearer, policy, baseline_summary=published)
    assert (failure["metric"], failure["kind"]) == ("cost_usd", "regression")
    assert failure["message"] == ("high: cost_usd rose by 0.003 from the published version's 0.01 to 0.013 "
                                  "(at most 0.002 allowed)")
    # a tier's own allowance is for proportions: a mean is not held to it
    assert gate_check(dearer, {"tiers": {"high": {"max_regression": 0.0}}}, baseline_summary=published) == []


def test_the_overall_tier_is_a_tier_like_the_others():
    summary = summarize(results("high", 5, 0) + results("low", 1, 4))
    [failure] = gate_check(summary, {"tiers": {"overall": {"pass_rate": {"min": 0.9}}}})
    assert failure["tier"] == "overall" and failure["value"] == 0.6


# --- the policy's shape ----------------------------------------------------------------------


def test_a_good_policy_has_no_problem():
    assert policy_problems(POLICY, definition=REFUND) == []
    assert policy_problems({"tiers": {"overall": {"pass_rate": {"min": 0.9, "bound": "ci"}},
                                      "low": {"latency_s": {"max": 30}, "scorer:anything": {"max": 100},
                                              "action:propose": {"min": 0.5}}}}, definition=REFUND) == []


@pytest.mark.parametrize("policy, path, message", [
    ({}, "", "'tiers' is a required property"),
    ({"tiers": {}}, "tiers", "should be non-empty"),
    ({"tiers": {"critical": {"pass_rate": {"min": 1}}}}, "tiers", "critical"),
    ({"tiers": {"high": {"pass_rate": {"least": 1}}}}, "tiers.high.pass_rate", "least"),
    ({"tiers": {"high": {"pass_rate": {}}}}, "tiers.high.pass_rate", "should be non-empty"),
    ({"tiers": {"high": {"max_regression": 2}}}, "tiers.high.max_regression", "maximum"),
    ({"tiers": {"high": {"pass_rate": {"min": 0.5, "bound": "median"}}}}, "tiers.high.pass_rate.bound", "median"),
    ({"tiers": {"high": {"Bad Name": {"min": 1}}}}, "tiers.high", "Bad Name"),
    ({"tiers": {"high": {"accuracy": {"min": 0.9}}}}, "tiers.high.accuracy", "not a metric"),
    ({"tiers": {"high": {"action": {"min": 0.9}}}}, "tiers.high.action", "not a metric"),  # per step only
    ({"tiers": {"high": {"run_state:propose": {"min": 0.9}}}}, "tiers.high.run_state:propose", "not a metric"),
    ({"tiers": {"high": {"action:ghost": {"min": 0.9}}}}, "tiers.high.action:ghost", "no step 'ghost'"),
    ({"tiers": {"high": {"pass_rate": {"bound": "ci"}}}}, "tiers.high.pass_rate", "min, max or max_regression"),
    ({"tiers": {"high": {"pass_rate": {"min": 0.9, "max": 0.5}}}}, "tiers.high.pass_rate", "nothing passes"),
    ({"tiers": {"high": {"pass_rate": {"min": 98}}}}, "tiers.high.pass_rate", "between 0 and 1"),
])
def test_a_bad_policy_is_refused_at_its_path(policy, path, message):
    problems = policy_problems(policy, definition=REFUND)
    assert [p["path"] for p in problems] == [path]
    assert message in problems[0]["message"]


def test_the_schema_names_the_tiers_and_the_thresholds():
    tiers = POLICY_SCHEMA["properties"]["tiers"]["properties"]
    assert set(tiers) == {"low", "medium", "high", "overall"}
    assert set(tiers["high"]["additionalProperties"]["properties"]) == {"min", "max", "max_regression", "bound"}
