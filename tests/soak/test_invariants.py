"""The soak's invariant checker catches what it exists to catch: a deliberately injected
duplicate effect, a lost run, a stuck one, a budget overrun or double charge, a gate not
honoured — and stays quiet on a clean account."""
from collections import Counter
from decimal import Decimal

from soak.invariants import Observed, RunFacts, violations


def clean() -> Observed:
    chain = RunFacts("o-0", "chain", "completed", "completed",
                     keys={"r0:pay:default": 1, "r0:notify:default": 1})
    saga = RunFacts("o-2", "saga", "compensation_failed", "compensation_failed",
                    keys={"r2:hold:default": 1, "r2:pay:default": 1, "r2:ship:default": 0,
                          "r2:pay:compensate": 0, "r2:hold:compensate": 0})
    gate = RunFacts("o-1", "gate", "failed", "failed", keys={"r1:send:default": 0},
                    decision="reject", approval="rejected")
    budget = RunFacts("o-4", "budget", "completed", "completed", cost=Decimal("0.3"),
                      attempts_cost=Decimal("0.3"), budget=Decimal("1"))
    # One payment's outcome was lost in a kill and resent under the same key: the remote
    # answered it twice but acted once.
    chain.resent_after_lost["r0:pay:default"] = 1
    effects = Counter({"r0:pay:default": 1, "r0:notify:default": 1, "r2:hold:default": 1,
                       "r2:pay:default": 1})
    answered = Counter({"r0:pay:default": 2, "r0:notify:default": 1, "r2:hold:default": 1,
                        "r2:pay:default": 1})
    return Observed([chain, saga, gate, budget], effects, answered)


def test_a_clean_account_has_no_violation():
    assert violations(clean()) == []


def test_a_deliberately_injected_duplicate_effect_is_caught():
    observed = clean()
    observed.effects["r0:notify:default"] += 1  # the remote acted twice on one key
    observed.answered_ok["r0:notify:default"] += 1
    found = violations(observed)
    assert any("r0:notify:default happened 2 times, expected 1" in line for line in found)
    assert any("r0:notify:default was acted on 2 times" in line for line in found)


def test_a_repeat_no_lost_outcome_explains_is_caught_even_at_a_deduplicating_remote():
    observed = clean()
    observed.answered_ok["r2:pay:default"] += 1  # a second successful call, no lost outcome
    assert violations(observed) == ["saga o-2: r2:pay:default was acted on 2 times by the remote, "
                                    "0 lost outcomes explain 1"]


def test_lost_stuck_doubled_and_wrongly_ended_runs_are_caught():
    observed = clean()
    observed.runs[0].state = None
    observed.runs[1].open_effects = 1
    observed.runs[2].runs_for_order = 2
    observed.runs[3].state = "paused"
    found = violations(observed)
    assert "chain o-0: lost — no run exists" in found
    assert any(line.startswith("saga o-2: stuck") for line in found)
    assert "gate o-1: 2 runs for one start" in found
    assert "budget o-4: ended paused, expected completed" in found


def test_an_effect_no_run_expects_a_budget_overrun_a_stale_charge_and_an_unhonoured_gate():
    observed = clean()
    observed.effects["r1:send:default"] = 1  # a rejected gate's action happened
    observed.runs[3].cost = Decimal("1.2")
    observed.runs[2].approval = "approved"
    found = violations(observed)
    assert "gate o-1: effect r1:send:default happened 1 times, expected 0" in found
    assert "budget o-4: cost 1.2 over the budget 1" in found
    assert any("charged 1.2, its finishing attempts cost 0.3" in line for line in found)
    assert "gate o-1: approval is approved, the reviewer chose reject" in found


def test_a_ledger_that_does_not_verify_is_a_violation():
    observed = clean()
    observed.audit_ok, observed.audit_detail = False, "entry 7: hash mismatch"
    assert violations(observed) == ["audit ledger does not verify: entry 7: hash mismatch"]
