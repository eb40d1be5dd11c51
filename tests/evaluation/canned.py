"""Evaluations as stored rows, for the tests of the pages and the API that show them.

The scorers (`evaluation.scoring`) are tested on their own; here an evaluation's cases get
scores written out (numbers the test chose) and its summary is summarised from them as an
evaluation does (`evaluation.summary.summarize`), so what a page or a response shows can be
checked against those numbers.
"""
from decimal import Decimal

from evaluation.evaluations import evaluation_start
from evaluation.models import CaseRunState, Evaluation
from evaluation.services import dataset_cases_add
from evaluation.summary import summarize

TIERS = ("low", "medium", "high")


def scores_for(key: str, tier: str, *, bad: set[str] = frozenset(), unauthorized: set[str] = frozenset()) -> dict:
    """A case's scores: every share metric true unless the case is in `bad`, unauthorized
    actions 1 for a case in `unauthorized`."""
    return {"run_state": True, "approval_routing": key not in bad, "action:propose": key not in bad,
            "action_accuracy": key not in bad,
            "unauthorized_actions": 1 if key in unauthorized else 0,
            "latency_s": 1.5 if tier == "high" else 0.5, "cost_usd": 0.002}


def scored(evaluation: Evaluation, *, bad=frozenset(), unauthorized=frozenset(), leave: int = 0,
           finish: bool = True, cost: str = "0.06") -> Evaluation:
    """Write scores on every case of `evaluation` (but the last `leave`, left pending) and, with
    `finish`, complete it with the summary of them."""
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
        summary = summarize(results)
        summary["cases"] = {s: evaluation.cases.filter(state=s).count() for s in CaseRunState.values}
        evaluation.complete(summary=summary)
        evaluation.save()
    return evaluation


def loaded(dataset, actor, cases: list[dict]):
    return dataset_cases_add(dataset=dataset, cases=cases, actor=actor)


def started(dataset, actor, *, version: int = 1, budget="5", **options) -> Evaluation:
    return evaluation_start(dataset=dataset, version=version, actor=actor, budget_usd=budget, **options)

