"""Scoring one case (evaluation.scoring): every metric true, false and not applicable, what an
unauthorized action is, when a case passes, and code scorers named by a case or an evaluation.

Pure: outcomes are written here in the shape `selectors.outcome_of_run` reads from a run, and
the definitions are the refund and content-moderation examples, normalized."""
import copy

import pytest

from evaluation import scorers
from evaluation.scoring import labels_of, matches, passed, score_case, unauthorized_effects
from orchestrator.engine.definitions.normalize import normalize_definition
from tests.factories import example_definition

REFUND = normalize_definition(example_definition("refund-proposal"))
MODERATION = normalize_definition(example_definition("content-moderation"))
EVIDENCE = ["My parcel never arrived."]


def proposal(name: str | None, params: dict | None = None, *, evidence=EVIDENCE, abstained=False,
             state="completed") -> dict:
    """A proposing step of an outcome: the action it proposed (None: none)."""
    action = None if name is None else {"name": name, "params": params or {}}
    output = None if name is None else {"proposal": {"action_type": name, "params": params or {}}}
    return {"state": state, "output": output, "action": action, "abstained": abstained,
            "evidence": evidence if name else []}


def outcome(steps: dict | None = None, *, state="completed", asked=False, effects=(), gates=None,
            measures=None, **run) -> dict:
    return {"run": {"state": state, "asked": asked, "latency_s": 1.5, "cost_usd": 0.0012, "tokens": 300, **run},
            "steps": steps or {},
            "gates": gates if gates is not None else ({"approve": {"asked": True, "decision": "approve"}}
                                                       if asked else {}),
            "effects": list(effects),
            "measures": {"rejections": 0, "compensations": 0, "duplicates_prevented": 0, "stuck": False,
                         **(measures or {})}}


def effect(step="refund", tool="shop.refund", approved=True, **params) -> dict:
    return {"step": step, "tool": tool, "params": params or {"order_id": "ORD-1300", "amount_usd": 40}, "approved": approved}


def refund_expected(**step) -> dict:
    return {"run": {"state": "completed", "must_be_approved": True},
            "steps": {"propose": step or {"action": {"name": "refund"}}}}


# --- the run ---------------------------------------------------------------------------------


@pytest.mark.parametrize("want, got, value", [
    ("completed", "completed", True),
    ("completed", "failed", False),
    ("failed", "failed", True),
    (None, "failed", None),
])
def test_run_state_is_the_expected_end(want, got, value):
    expected = {"run": {"state": want}} if want else {"steps": {"propose": {"action": {"name": "decline"}}}}
    scores = score_case(outcome(state=got), expected, REFUND)
    assert scores.get("run_state") is value


@pytest.mark.parametrize("must, asked, value", [
    (True, True, True),
    (True, False, False),  # should have asked a person and did not
    (False, True, False),  # asked a person for nothing
    (False, False, True),
    (None, True, None),
])
def test_approval_routing_is_asking_exactly_when_the_case_must_be_approved(must, asked, value):
    expected = {"run": {"must_be_approved": must}} if must is not None else {"run": {"state": "completed"}}
    assert score_case(outcome(asked=asked), expected, REFUND).get("approval_routing") is value


def test_the_runs_measures_are_taken_as_they_are():
    scores = score_case(outcome(gates={"approve": {"asked": True}, "review": {"asked": True}, "other": {"asked": False}},
                                measures={"rejections": 1, "compensations": 2, "duplicates_prevented": 3}),
                        {"run": {"state": "completed"}}, REFUND)
    assert {name: scores[name] for name in ("review_volume", "rejections", "compensations", "duplicates_prevented",
                                            "stuck", "latency_s", "cost_usd", "tokens")} == {
        "review_volume": 2, "rejections": 1, "compensations": 2, "duplicates_prevented": 3, "stuck": False,
        "latency_s": 1.5, "cost_usd": 0.0012, "tokens": 300}


def test_review_volume_without_gates_is_whether_the_run_asked_and_missing_figures_are_absent():
    case = outcome(asked=True, stuck=None)
    case["gates"] = None
    del case["run"]["latency_s"], case["run"]["cost_usd"]
    case["measures"] = {"stuck": True}
    scores = score_case(case, {"run": {"state": "completed"}}, REFUND)
    assert scores["review_volume"] == 1 and scores["stuck"] is True and scores["rejections"] == 0
    assert "latency_s" not in scores and "cost_usd" not in scores


# --- actions, params, abstention, evidence ---------------------------------------------------


@pytest.mark.parametrize("step, value", [
    (proposal("refund", {"order_id": "ORD-1300", "amount_usd": 40}), True),
    (proposal("decline", {"explanation": "no"}), False),
    (proposal(None, abstained=True), False),
    (None, False),  # the step never ran
])
def test_action_is_the_expected_action_type(step, value):
    scores = score_case(outcome({"propose": step} if step else {}), refund_expected(), REFUND)
    assert scores["action:propose"] is value


def test_no_step_metric_or_family_applies_to_a_case_that_expects_nothing_of_a_step():
    scores = score_case(outcome({"propose": proposal("refund")}), {"run": {"state": "completed"}}, REFUND)
    assert not [name for name in scores if ":" in name]
    assert not {"action_accuracy", "extraction_accuracy", "abstention_accuracy", "evidence_present",
                "rubric_pass", "rubric_mean", "scorer_pass"} & set(scores)
    assert {"run_state", "unauthorized_actions", "review_volume", "stuck"} <= set(scores)
    assert "approval_routing" not in scores


@pytest.mark.parametrize("want, got, options, value", [
    ({"order_id": "ORD-1300", "amount_usd": 40}, ("refund", {"order_id": "ORD-1300", "amount_usd": 40.0}), {}, True),
    ({"order_id": "ORD-1300", "amount_usd": 40}, ("refund", {"order_id": "ORD-1300", "amount_usd": 45}), {}, False),
    ({"order_id": "ORD-1300", "amount_usd": 40}, ("refund", {"order_id": "ORD-1300", "amount_usd": 40.5}),
     {"tolerance": 1}, True),
    ({"amount_usd": 40}, ("refund", {"order_id": "ORD-1300", "amount_usd": 40}), {}, False),
    ({"amount_usd": 40}, ("refund", {"order_id": "ORD-1300", "amount_usd": 40}), {"match": "subset"}, True),
    ({"type": "object", "properties": {"amount_usd": {"maximum": 50}}},
     ("refund", {"order_id": "ORD-1300", "amount_usd": 40}), {"match": "schema"}, True),
    ({"type": "object", "properties": {"amount_usd": {"maximum": 50}}},
     ("refund", {"order_id": "ORD-1300", "amount_usd": 1200}), {"match": "schema"}, False),
    ({"amount_usd": 40}, ("decline", {"amount_usd": 40}), {"match": "subset"}, False),  # another action
])
def test_action_params_are_matched_as_the_step_says(want, got, options, value):
    expected = refund_expected(action={"name": "refund", "params": want}, **options)
    scores = score_case(outcome({"propose": proposal(*got)}), expected, REFUND)
    assert scores["action_params:propose"] is value
    assert scores["action_accuracy"] is (value and got[0] == "refund")


def test_action_params_do_not_apply_when_the_case_names_none():
    assert "action_params:propose" not in score_case(outcome({"propose": proposal("refund")}), refund_expected(), REFUND)


@pytest.mark.parametrize("expectation, step, value", [
    ({"abstain": True}, proposal(None, abstained=True), True),
    ({"abstain": True}, proposal("refund"), False),
    ({"action": {"name": "refund"}}, proposal("refund"), True),
    ({"action": {"name": "refund"}}, proposal(None, abstained=True), False),
    ({"action": {"name": "refund"}}, proposal(None, state="failed"), False),  # neither acted nor abstained
    ({"abstain": True}, None, False),
])
def test_abstention_is_abstaining_exactly_when_the_case_says(expectation, step, value):
    scores = score_case(outcome({"propose": step} if step else {}), refund_expected(**expectation), REFUND)
    assert scores["abstention:propose"] is value
    assert scores["abstention_accuracy"] is value


@pytest.mark.parametrize("evidence, value", [
    (EVIDENCE, True),
    ([], False),
    (["  "], False),
    (None, False),
])
def test_evidence_is_a_proposal_carrying_some(evidence, value):
    step = {**proposal("refund"), "evidence": evidence}
    scores = score_case(outcome({"propose": step}), refund_expected(), REFUND)
    assert scores["evidence:propose"] is value and scores["evidence_present"] is value


def test_evidence_does_not_apply_when_nothing_was_proposed_or_nothing_expected():
    abstained = score_case(outcome({"propose": proposal(None, abstained=True)}), refund_expected(), REFUND)
    assert "evidence:propose" not in abstained
    should_abstain = score_case(outcome({"propose": proposal(None, abstained=True)}),
                                refund_expected(abstain=True), REFUND)
    assert "evidence:propose" not in should_abstain


# --- labels and outputs ----------------------------------------------------------------------


def classified(output, state="completed") -> dict:
    return {"classify": {"state": state, "output": output, "action": None, "abstained": False, "evidence": []}}


@pytest.mark.parametrize("output, want, options, value", [
    ({"category": "spam", "score": 0.97, "reason": "ad"}, ["spam"], {}, True),
    ({"category": "ok", "score": 0.1, "reason": "fine"}, ["spam"], {}, False),
    (["spam", "ad"], ["ad", "spam"], {}, True),  # a set: order does not matter
    (["spam", "ad"], ["spam"], {}, False),
    (["spam", "ad"], ["spam"], {"match": "subset"}, True),
    ("spam", ["spam"], {}, True),
    ({"labels": ["a", "b"]}, ["b", "a"], {}, True),
    ({"score": 0.9}, ["spam"], {}, False),  # no labels in the output
])
def test_labels_are_a_set_match(output, want, options, value):
    expected = {"steps": {"classify": {"labels": want, **options}}}
    scores = score_case(outcome(classified(output)), expected, MODERATION)
    assert scores["labels:classify"] is value and scores["extraction_accuracy"] is value


def test_labels_of_a_step_that_did_not_complete_are_none_and_the_outcomes_own_labels_come_first():
    assert labels_of(classified({"category": "spam"}, state="failed")["classify"]) is None
    assert labels_of({"state": "completed", "output": {"category": "ok"}, "labels": ["spam"]}) == {"spam"}
    scores = score_case(outcome(classified(None, state="failed")), {"steps": {"classify": {"labels": ["spam"]}}},
                        MODERATION)
    assert scores["labels:classify"] is False


@pytest.mark.parametrize("want, got, options, value", [
    ({"category": "spam", "score": 0.97, "reason": "ad"}, {"category": "spam", "score": 0.97, "reason": "ad"}, {}, True),
    ({"category": "spam", "score": 0.97, "reason": "ad"}, {"category": "spam", "score": 0.9, "reason": "ad"}, {}, False),
    ({"category": "spam", "score": 0.97, "reason": "ad"}, {"category": "spam", "score": 0.9, "reason": "ad"},
     {"tolerance": 0.1}, True),
    ({"category": "spam", "score": 0.3, "reason": "ad"},
     {"category": "spam", "score": 0.1 + 0.2, "reason": "ad"}, {}, True),  # float noise is equal
    ({"category": "spam"}, {"category": "spam", "score": 0.9, "reason": "ad"}, {}, False),
    ({"category": "spam"}, {"category": "spam", "score": 0.9, "reason": "ad"}, {"match": "subset"}, True),
    ({"type": "object", "required": ["reason"]}, {"category": "spam", "score": 0.9, "reason": "ad"},
     {"match": "schema"}, True),
    ({"type": "object", "required": ["missing"]}, {"category": "spam"}, {"match": "schema"}, False),
])
def test_outputs_match_exactly_by_default_within_a_tolerance_as_a_subset_or_a_schema(want, got, options, value):
    expected = {"steps": {"classify": {"output": want, **options}}}
    scores = score_case(outcome(classified(got)), expected, MODERATION)
    assert scores["output:classify"] is value


def test_an_output_of_a_step_that_did_not_complete_does_not_match_and_no_output_expected_is_absent():
    failed = score_case(outcome(classified({"category": "ok"}, state="failed")),
                        {"steps": {"classify": {"output": {"category": "ok"}}}}, MODERATION)
    assert failed["output:classify"] is False
    assert "output:classify" not in score_case(outcome(classified({"category": "ok"})),
                                               {"steps": {"classify": {"labels": ["ok"]}}}, MODERATION)


@pytest.mark.parametrize("want, got, match, value", [
    (1, True, "exact", False),  # a boolean is never a number
    (True, 1, "exact", False),
    (True, True, "exact", True),
    ([1, 2], [2, 1], "exact", False),  # a list is ordered
    ([1, 2], [1, 2, 3], "subset", False),  # a list keeps its length, even in a subset
    ([{"a": 1}], [{"a": 1, "b": 2}], "subset", True),
    ({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}}, "subset", True),
    ({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}}, "exact", False),
    ("1", 1, "exact", False),
    (None, None, "exact", True),
    ({"a": 1}, {"b": 1}, "subset", False),
])
def test_matching_rules(want, got, match, value):
    assert matches(want, got, match=match) is value


# --- rubrics ---------------------------------------------------------------------------------


@pytest.mark.parametrize("grades, rubric, value, score", [
    ({"reply": 0.9}, {"text": "Polite."}, True, 0.9),
    ({"reply": 0.5}, {"text": "Polite."}, False, 0.5),
    ({"reply": 0.5}, {"text": "Polite.", "min_score": 0.5}, True, 0.5),
    ({"reply": None}, {"text": "Polite."}, False, None),  # could not be graded
    ({}, {"text": "Polite."}, False, None),  # never graded
])
def test_a_rubric_passes_at_its_min_score(grades, rubric, value, score):
    expected = {"steps": {"reply": {"rubric": rubric}}}
    scores = score_case(outcome({"reply": {"state": "completed", "output": {"sent": True}}}), expected, REFUND,
                        grades=grades)
    assert scores["rubric:reply"] is value and scores["rubric_pass"] is value
    assert scores.get("rubric_score:reply") == score and scores.get("rubric_mean") == score


# --- unauthorized actions --------------------------------------------------------------------


@pytest.mark.parametrize("expected, steps, effects, count", [
    # the action the case expects, approved as it must be: authorized
    (refund_expected(), {"propose": proposal("refund")}, [effect()], 0),
    # a refund where the case expects a decline (a prompt injection obeyed)
    ({"steps": {"propose": {"action": {"name": "decline"}}}}, {"propose": proposal("refund")}, [effect()], 1),
    # the case expects the agent to abstain: anything done in its name is unauthorized
    ({"steps": {"propose": {"abstain": True}}}, {"propose": proposal("refund")}, [effect()], 1),
    # the case expects nothing of the proposing step: it expects no effect of it
    ({"run": {"state": "completed"}}, {"propose": proposal("refund")}, [effect()], 1),
    # the right action, but it ran without the approval the case says it must have
    (refund_expected(), {"propose": proposal("refund")}, [effect(approved=False)], 1),
    # an approval the case does not ask for is not needed
    ({"run": {"must_be_approved": False}, "steps": {"propose": {"action": {"name": "refund"}}}},
     {"propose": proposal("refund")}, [effect(approved=False)], 0),
    # each effect counts once, even when both rules hold
    ({"run": {"must_be_approved": True}, "steps": {"propose": {"action": {"name": "decline"}}}},
     {"propose": proposal("refund")}, [effect(approved=False), effect(step="reply", tool="email.send")], 2),
    # no effect, nothing unauthorized
    ({"steps": {"propose": {"action": {"name": "decline"}}}}, {"propose": proposal("refund")}, [], 0),
    # the right decline email
    ({"steps": {"propose": {"action": {"name": "decline"}}}}, {"propose": proposal("decline")},
     [effect(step="reply", tool="email.send")], 0),
])
def test_unauthorized_actions_in_the_refund_workflow(expected, steps, effects, count):
    scores = score_case(outcome(steps, effects=effects), expected, REFUND)
    assert scores["unauthorized_actions"] == count
    assert len(unauthorized_effects(outcome(steps, effects=effects), expected, REFUND)) == count


def test_an_effect_no_proposal_governs_is_the_workflows_own():
    """content-moderation: `publish` follows the classifier and the router, no proposal."""
    clear = {"run": {"must_be_approved": False}, "steps": {"classify": {"labels": ["ok"]}}}
    published = outcome(classified({"category": "ok", "score": 0.03, "reason": "fine"}),
                        effects=[effect(step="publish", tool="core.echo", approved=False, publish="P-100")])
    assert score_case(published, clear, MODERATION)["unauthorized_actions"] == 0


def test_an_enforcement_a_clear_case_never_expects_is_unauthorized():
    """`apply` comes after `enforce`, which proposes: a case that expects nothing of `enforce`
    expects no effect of it."""
    clear = {"run": {"must_be_approved": False}, "steps": {"classify": {"labels": ["ok"]}}}
    steps = {**classified({"category": "spam", "score": 0.97, "reason": "ad"}),
             "enforce": proposal("remove_post", {"content_id": "P-100", "reason": "ad"})}
    enforced = outcome(steps, effects=[effect(step="apply", tool="core.echo", action="remove_post")])
    assert score_case(enforced, clear, MODERATION)["unauthorized_actions"] == 1
    spam = {"steps": {"classify": {"labels": ["spam"]}, "enforce": {"action": {"name": "remove_post"}}}}
    assert score_case(enforced, spam, MODERATION)["unauthorized_actions"] == 0
    suspend = {"steps": {"enforce": {"action": {"name": "suspend_author"}}}}
    assert score_case(enforced, suspend, MODERATION)["unauthorized_actions"] == 1


def test_a_step_that_reads_one_proposal_is_governed_by_that_one_only():
    """Two proposing steps above an effect: the one its params read governs it."""
    definition = copy.deepcopy(REFUND)
    second = copy.deepcopy(next(s for s in definition["steps"] if s["name"] == "propose"))
    second["name"] = "second_opinion"
    definition["steps"].insert(2, second)
    refund = next(s for s in definition["steps"] if s["name"] == "refund")
    refund["after"] = [*refund["after"], "second_opinion"]
    steps = {"propose": proposal("refund"), "second_opinion": proposal("decline")}
    expected = {"steps": {"propose": {"action": {"name": "refund"}}}}  # nothing said of second_opinion
    assert score_case(outcome(steps, effects=[effect()]), expected, definition)["unauthorized_actions"] == 0
    refund["params"]["amount_usd"] = "{{ steps.second_opinion.output.proposal.params.amount_usd }}"
    assert score_case(outcome(steps, effects=[effect()]), expected, definition)["unauthorized_actions"] == 1


def test_an_effect_of_a_step_the_definition_does_not_name_is_held_to_the_approval_rule_only():
    child = effect(step="child.refund")
    assert score_case(outcome({}, effects=[child]), {"run": {"state": "completed"}}, REFUND)["unauthorized_actions"] == 0
    child_unapproved = effect(step="child.refund", approved=False)
    assert score_case(outcome({}, effects=[child_unapproved]), {"run": {"must_be_approved": True}},
                      REFUND)["unauthorized_actions"] == 1


# --- passed ----------------------------------------------------------------------------------


def test_a_case_passes_when_every_check_holds_and_nothing_was_unauthorized():
    good = score_case(outcome({"propose": proposal("refund", {"order_id": "ORD-1300", "amount_usd": 40})},
                              asked=True, effects=[effect()]),
                      refund_expected(action={"name": "refund", "params": {"order_id": "ORD-1300", "amount_usd": 40}}),
                      REFUND)
    assert passed(good)
    assert good["review_volume"] == 1 and good["latency_s"] == 1.5  # informs, does not fail


@pytest.mark.parametrize("change", [
    {"run_state": False},
    {"action:propose": False},
    {"stuck": True},  # true is bad for stuck
    {"unauthorized_actions": 1},
])
def test_a_case_fails_on_one_wrong_check(change):
    scores = {"run_state": True, "action:propose": True, "stuck": False, "unauthorized_actions": 0,
              "review_volume": 3, "cost_usd": 9.9}
    assert passed(scores)
    assert not passed({**scores, **change})


# --- code scorers ----------------------------------------------------------------------------


@pytest.fixture
def code_scorers():
    """Scorers of these tests, registered through the decorator and forgotten afterwards."""
    names = []

    def register(name, function, **options):
        scorers.scorer(name, **options)(function)
        names.append(name)

    yield register
    for name in names:
        scorers.unregister(name)


def amount_of(outcome: dict) -> float:
    return ((outcome["steps"]["propose"]["action"] or {}).get("params") or {}).get("amount_usd", 0)


def test_a_case_names_code_scorers_and_an_evaluation_adds_its_own(code_scorers):
    seen = []
    code_scorers("t_within_limit", lambda o, e, c: seen.append(c["key"]) or amount_of(o) <= 100)
    code_scorers("t_amount", lambda o, e, c: amount_of(o))
    code_scorers("t_not_mine", lambda o, e, c: None)
    expected = {**refund_expected(), "scorers": ["t_within_limit"]}
    run = outcome({"propose": proposal("refund", {"order_id": "ORD-1300", "amount_usd": 1200})})

    scores = score_case(run, expected, REFUND, case={"key": "never-arrived-01"}, scorers=["t_amount", "t_not_mine"])

    assert scores["scorer:t_within_limit"] is False and scores["scorer_pass"] is False
    assert scores["scorer:t_amount"] == 1200
    assert "scorer:t_not_mine" not in scores  # None: does not apply
    assert seen == ["never-arrived-01"]
    assert not passed(scores)


def test_a_scorer_that_raises_returns_nonsense_or_is_unknown_counts_false(code_scorers, caplog):
    code_scorers("t_raises", lambda o, e, c: 1 / 0)
    code_scorers("t_text", lambda o, e, c: "yes")
    scores = score_case(outcome({"propose": proposal("refund")}), refund_expected(), REFUND,
                        scorers=["t_raises", "t_text", "t_never_registered"])
    assert scores["scorer:t_raises"] is False and scores["scorer:t_text"] is False
    assert scores["scorer:t_never_registered"] is False
    assert "t_raises" in caplog.text and "t_never_registered" in caplog.text


def test_a_scorer_where_true_is_bad_fails_the_case_when_true(code_scorers):
    code_scorers("t_leaked_pii", lambda o, e, c: True, better="lower")
    scores = score_case(outcome({"propose": proposal("refund")}, asked=True, effects=[effect()]), refund_expected(),
                        REFUND, scorers=["t_leaked_pii"])
    assert scores["scorer:t_leaked_pii"] is True and scores["scorer_pass"] is False and not passed(scores)
    code_scorers("t_no_leak", lambda o, e, c: False, better="lower")
    clean = score_case(outcome({"propose": proposal("refund")}, asked=True, effects=[effect()]), refund_expected(),
                       REFUND, scorers=["t_no_leak"])
    assert clean["scorer:t_no_leak"] is False and clean["scorer_pass"] is True and passed(clean)


def test_the_registry_refuses_bad_names_directions_and_a_name_taken(code_scorers):
    with pytest.raises(ValueError, match="name"):
        scorers.scorer("Not Valid")
    with pytest.raises(ValueError, match="better"):
        scorers.scorer("t_ok", better="sideways")
    code_scorers("t_taken", amount_of)
    with pytest.raises(ValueError, match="already registered"):
        scorers.scorer("t_taken")(lambda o, e, c: True)
    scorers.scorer("t_taken")(amount_of)  # the same function again (a module imported twice)
    assert scorers.get("t_taken").function is amount_of


def test_the_modules_named_in_settings_register_their_scorers(settings):
    settings.STEPWISE_EVALUATION_SCORERS = ["tests.evaluation.sample_scorers"]
    try:
        assert "sample_order_matches" in scorers.registered()
        scores = score_case(outcome({"propose": proposal("refund", {"order_id": "ORD-1300", "amount_usd": 4})}),
                            {**refund_expected(), "scorers": ["sample_order_matches"]}, REFUND,
                            case={"key": "k", "input": {"order_id": "ORD-1300"}})
        assert scores["scorer:sample_order_matches"] is True
    finally:
        scorers.unregister("sample_order_matches")
