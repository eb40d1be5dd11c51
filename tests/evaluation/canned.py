"""Evaluations as stored rows, for the tests of the pages and the API that show them.

The scorers (`evaluation.scoring`) are tested on their own; here an evaluation's cases get
scores written out and its summary is built in the shape the summaries have
(`{"overall"|"low"|"medium"|"high": {"cases", "passed", "metrics": {name: {"kind", "n", "value",
"ci"}}}, "cases": {state: n}}`), so what a page or a response shows can be checked against
numbers the test chose. `canned_compare` answers in `scoring.compare`'s shape for the
comparison's tests.
"""
from decimal import Decimal

from evaluation.evaluations import evaluation_start
from evaluation.models import CaseRunState, Evaluation
from evaluation.services import dataset_cases_add

TIERS = ("low", "medium", "high")


def scores_for(key: str, tier: str, *, bad: set[str] = frozenset(), unauthorized: set[str] = frozenset()) -> dict:
    """A case's scores: every share metric true unless the case is in `bad`, unauthorized
    actions 1 for a case in `unauthorized`."""
    return {"run_state": True, "approval_routing": key not in bad, "action:propose": key not in bad,
            "action_accuracy": key not in bad,
            "unauthorized_actions": 1 if key in unauthorized else 0,
            "latency_s": 1.5 if tier == "high" else 0.5, "cost_usd": 0.002}


def _entry(values: list) -> dict:
    n = len(values)
    value = sum(float(v) for v in values) / n
    spread = 0.5 / n ** 0.5 if n else 0
    proportion = all(isinstance(v, bool) for v in values)
    low, high = max(0.0, value - spread), value + spread
    kind = "proportion" if proportion else "count" if all(isinstance(v, int) for v in values) else "mean"
    return {"kind": kind, "n": n, "value": round(value, 4),
            "ci": [round(low, 4), round(min(1.0, high) if proportion else high, 4)]}


def canned_summary(results: list[dict]) -> dict:
    """`scoring.summarize`'s shape over `results` ({"case", "risk_tier", "scores", "passed"})."""
    summary = {}
    for tier in ("overall", *TIERS):
        rows = [r for r in results if tier == "overall" or r["risk_tier"] == tier]
        metrics = sorted({m for r in rows for m in r["scores"]})
        figures = {m: _entry([r["scores"][m] for r in rows if m in r["scores"]]) for m in metrics}
        if rows:
            figures["pass_rate"] = _entry([bool(r["passed"]) for r in rows])
        summary[tier] = {"cases": len(rows), "passed": sum(bool(r["passed"]) for r in rows), "metrics": figures}
    return summary


def canned_compare(base: list[dict], new: list[dict]) -> dict:
    """`scoring.compare`'s documented shape: each case and metric that changed, per-tier deltas."""
    by_key = {r["case"]: r for r in base}
    changed = []
    for row in new:
        before = by_key.get(row["case"])
        if before is None:
            continue
        for metric in sorted(set(before["scores"]) | set(row["scores"])):
            b, n = before["scores"].get(metric), row["scores"].get(metric)
            if b != n and isinstance(n, bool):
                changed.append({"case": row["case"], "risk_tier": row["risk_tier"], "metric": metric,
                                "base": b, "new": n, "direction": "better" if n else "worse"})
            elif b != n and metric == "unauthorized_actions":
                changed.append({"case": row["case"], "risk_tier": row["risk_tier"], "metric": metric,
                                "base": b, "new": n, "direction": "worse" if (n or 0) > (b or 0) else "better"})
    a, b = canned_summary(base), canned_summary(new)
    tiers = {tier: {m: {"base": a[tier]["metrics"][m]["value"], "new": b[tier]["metrics"][m]["value"],
                        "delta": round(b[tier]["metrics"][m]["value"] - a[tier]["metrics"][m]["value"], 4)}
                    for m in a[tier]["metrics"] if m in b[tier]["metrics"]} for tier in a}
    keys_b, keys_n = {r["case"] for r in base}, {r["case"] for r in new}
    return {"changed": changed, "tiers": tiers, "only_in_base": sorted(keys_b - keys_n),
            "only_in_new": sorted(keys_n - keys_b)}


def scored(evaluation: Evaluation, *, bad=frozenset(), unauthorized=frozenset(), leave: int = 0,
           finish: bool = True, cost: str = "0.06") -> Evaluation:
    """Write scores on every case of `evaluation` (but the last `leave`, left pending) and, with
    `finish`, complete it with the canned summary of them."""
    rows = list(evaluation.cases.order_by("key"))
    for row in rows[:len(rows) - leave]:
        row.state, row.scores = CaseRunState.SCORED, scores_for(row.key, row.risk_tier, bad=bad,
                                                                 unauthorized=unauthorized)
        row.passed = row.key not in bad and row.key not in unauthorized
        row.save(update_fields=["state", "scores", "passed"])
    Evaluation.objects.filter(pk=evaluation.pk).update(cost_usd=Decimal(cost))
    evaluation.refresh_from_db()
    if finish:
        results = [{"case": r.key, "risk_tier": r.risk_tier, "scores": r.scores, "passed": r.passed}
                   for r in evaluation.cases.filter(state=CaseRunState.SCORED)]
        summary = canned_summary(results)
        summary["cases"] = {s: evaluation.cases.filter(state=s).count() for s in CaseRunState.values}
        evaluation.complete(summary=summary)
        evaluation.save()
    return evaluation


def loaded(dataset, actor, cases: list[dict]):
    return dataset_cases_add(dataset=dataset, cases=cases, actor=actor)


def started(dataset, actor, *, version: int = 1, budget="5", **options) -> Evaluation:
    return evaluation_start(dataset=dataset, version=version, actor=actor, budget_usd=budget, **options)

