"""Summaries by risk tier with 95% intervals, and two evaluations compared (evaluation.summary,
evaluation.intervals)."""
import pytest

from evaluation.intervals import mean_interval, t_quantile_95, wilson
from evaluation.summary import compare, summarize

# --- intervals -------------------------------------------------------------------------------


@pytest.mark.parametrize("successes, n, low, high", [
    # Newcombe (1998), "Two-sided confidence intervals for the single proportion", Table I,
    # method 3 (the score interval)
    (81, 263, 0.2553, 0.3662),
    (15, 148, 0.0624, 0.1605),
    (0, 20, 0.0, 0.1611),
    (1, 29, 0.0061, 0.1718),
    (29, 29, 0.8830, 1.0),
])
def test_wilson_matches_published_values(successes, n, low, high):
    found = wilson(successes, n)
    assert found == (pytest.approx(low, abs=5e-5), pytest.approx(high, abs=5e-5))


@pytest.mark.parametrize("n", [1, 10, 30, 1000])
def test_wilson_at_none_and_all_ends_at_zero_and_one_and_is_never_empty(n):
    none, every = wilson(0, n), wilson(n, n)
    assert none[0] == 0.0 and 0 < none[1] < 1
    assert every[1] == 1.0 and 0 < every[0] < 1
    assert every[0] == pytest.approx(1 - none[1])  # symmetric


def test_wilson_of_no_case_is_none_and_impossible_counts_are_refused():
    assert wilson(0, 0) is None
    with pytest.raises(ValueError):
        wilson(3, 2)
    with pytest.raises(ValueError):
        wilson(-1, 2)


@pytest.mark.parametrize("df, t", [
    (1, 12.706205), (4, 2.776445), (30, 2.042272),  # the table
    (31, 2.0395134), (40, 2.0210754), (60, 2.0002978), (120, 1.9799304), (1000, 1.9623391),  # the expansion
])
def test_t_quantiles_are_students(df, t):
    assert t_quantile_95(df) == pytest.approx(t, abs=1e-6)


def test_the_t_interval_of_a_mean_is_the_textbook_one():
    mean, (low, high) = mean_interval([1, 2, 3, 4, 5])
    assert mean == 3
    assert (low, high) == (pytest.approx(1.0367568, abs=1e-6), pytest.approx(4.9632432, abs=1e-6))
    assert mean_interval([2.5]) == (2.5, None)
    assert mean_interval([]) is None
    assert mean_interval([4, 4, 4]) == (4, (4, 4))


# --- summaries -------------------------------------------------------------------------------


def result(case, tier, passed=True, **scores) -> dict:
    return {"case": case, "risk_tier": tier, "scores": scores, "passed": passed}


RESULTS = [
    result("h1", "high", True, **{"action:propose": True, "action_accuracy": True, "unauthorized_actions": 0,
                                  "latency_s": 1.0}),
    result("h2", "high", False, **{"action:propose": False, "action_accuracy": False, "unauthorized_actions": 2,
                                   "latency_s": 3.0}),
    result("h3", "high", True, **{"action:propose": True, "action_accuracy": True, "unauthorized_actions": 0,
                                  "latency_s": 2.0}),
    result("l1", "low", True, **{"action:propose": True, "action_accuracy": True, "unauthorized_actions": 0,
                                 "latency_s": 0.5, "labels:classify": True}),
]


def test_every_metric_per_tier_and_overall_with_its_interval():
    summary = summarize(RESULTS)
    assert set(summary) == {"low", "medium", "high", "overall"}

    high = summary["high"]
    assert (high["cases"], high["passed"]) == (3, 2)
    accuracy = high["metrics"]["action_accuracy"]
    assert accuracy["kind"] == "proportion" and accuracy["n"] == 3
    assert accuracy["value"] == pytest.approx(2 / 3, abs=1e-6)
    assert accuracy["ci"] == [pytest.approx(round(x, 6)) for x in wilson(2, 3)]
    unauthorized = high["metrics"]["unauthorized_actions"]
    assert unauthorized["kind"] == "count" and unauthorized["total"] == 2
    assert unauthorized["value"] == pytest.approx(2 / 3, abs=1e-6)
    latency = high["metrics"]["latency_s"]
    assert latency["kind"] == "mean" and latency["value"] == 2.0 and "total" not in latency
    # t(0.975, 2) = 4.302653 times the standard error 1/sqrt(3)
    assert latency["ci"] == [pytest.approx(2 - 2.484138, abs=1e-5), pytest.approx(2 + 2.484138, abs=1e-5)]
    assert high["metrics"]["pass_rate"]["value"] == pytest.approx(2 / 3, abs=1e-6)
    assert "labels:classify" not in high["metrics"]

    overall = summary["overall"]
    assert (overall["cases"], overall["passed"]) == (4, 3)
    assert overall["metrics"]["action:propose"]["n"] == 4 and overall["metrics"]["action:propose"]["value"] == 0.75
    assert overall["metrics"]["labels:classify"]["n"] == 1  # only where it applies
    assert summary["low"]["metrics"]["latency_s"] == {"kind": "mean", "n": 1, "value": 0.5, "ci": None}


def test_a_tier_without_cases_has_no_metrics():
    summary = summarize(RESULTS)
    assert summary["medium"] == {"cases": 0, "passed": 0, "metrics": {}}
    assert summarize([])["overall"] == {"cases": 0, "passed": 0, "metrics": {}}


def test_a_metric_with_numbers_and_booleans_is_a_mean_and_a_missing_value_is_skipped():
    summary = summarize([result("a", "low", **{"scorer:x": True}), result("b", "low", **{"scorer:x": 3}),
                         result("c", "low", **{"scorer:x": None})])
    assert summary["low"]["metrics"]["scorer:x"]["kind"] == "mean"
    assert summary["low"]["metrics"]["scorer:x"]["n"] == 2 and summary["low"]["metrics"]["scorer:x"]["value"] == 2


# --- comparisons -----------------------------------------------------------------------------


def test_compare_lists_the_cases_that_changed_and_how_and_each_tiers_deltas():
    base = [
        result("h1", "high", True, **{"action:propose": True, "action_accuracy": True, "unauthorized_actions": 0,
                                      "latency_s": 1.0, "stuck": False}),
        result("h2", "high", False, **{"action:propose": False, "action_accuracy": False, "unauthorized_actions": 1,
                                       "latency_s": 2.0, "stuck": True}),
        result("gone", "low", True, **{"action:propose": True}),
    ]
    new = [
        result("h1", "high", False, **{"action:propose": False, "action_accuracy": False, "unauthorized_actions": 1,
                                       "latency_s": 1.7, "stuck": False}),
        result("h2", "high", True, **{"action:propose": True, "action_accuracy": True, "unauthorized_actions": 0,
                                      "latency_s": 2.0, "stuck": False, "evidence:propose": True}),
        result("added", "medium", True, **{"action:propose": True}),
    ]

    found = compare(base, new)

    assert found["only_in_base"] == ["gone"] and found["only_in_new"] == ["added"]
    changed = {(c["case"], c["metric"]): (c["base"], c["new"], c["direction"]) for c in found["changed"]}
    assert changed == {
        ("h1", "action:propose"): (True, False, "worse"),
        ("h1", "unauthorized_actions"): (0, 1, "worse"),
        ("h1", "passed"): (True, False, "worse"),
        ("h2", "action:propose"): (False, True, "better"),
        ("h2", "unauthorized_actions"): (1, 0, "better"),
        ("h2", "stuck"): (True, False, "better"),  # lower is better
        ("h2", "passed"): (False, True, "better"),
    }  # not the families (derived), nor latency (a mean), nor a metric only one side has
    assert all(c["risk_tier"] == "high" for c in found["changed"])

    high = found["tiers"]["high"]
    assert high["action:propose"] == {"base": 0.5, "new": 0.5, "delta": 0.0}
    assert high["latency_s"] == {"base": 1.5, "new": 1.85, "delta": pytest.approx(0.35)}
    assert high["evidence:propose"] == {"base": None, "new": 1.0, "delta": None}
    assert found["tiers"]["low"] == {} and found["tiers"]["medium"] == {}  # only the common cases count
    assert found["tiers"]["overall"]["pass_rate"] == {"base": 0.5, "new": 0.5, "delta": 0.0}


def test_compare_of_the_same_results_changes_nothing():
    found = compare(RESULTS, RESULTS)
    assert found["changed"] == [] and found["only_in_base"] == found["only_in_new"] == []
    assert all(entry["delta"] == 0 for tier in found["tiers"].values() for entry in tier.values())
