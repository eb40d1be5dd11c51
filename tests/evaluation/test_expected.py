"""The expected outcome's scoring options (evaluation.expected): match, tolerance, rubric and
code scorers, each accepted where it means something and refused at its path elsewhere."""
import pytest

from evaluation import scorers
from evaluation.expected import SCHEMA, expected_problems
from orchestrator.engine.definitions.normalize import normalize_definition
from tests.factories import example_definition

REFUND = normalize_definition(example_definition("refund-proposal"))
MODERATION = normalize_definition(example_definition("content-moderation"))
OUTPUT = {"category": "spam", "score": 0.97, "reason": "ad"}


def paths(problems: list[dict]) -> list[str]:
    return [problem["path"] for problem in problems]


@pytest.mark.parametrize("definition, steps", [
    (MODERATION, {"classify": {"output": OUTPUT, "tolerance": 0.05}}),
    (MODERATION, {"classify": {"output": {"category": "spam"}, "match": "subset"}}),  # not a whole output
    (MODERATION, {"classify": {"output": {"type": "object", "required": ["reason"]}, "match": "schema"}}),
    (MODERATION, {"classify": {"labels": ["spam"], "match": "subset"}}),
    (MODERATION, {"classify": {"rubric": {"text": "The reason names the rule broken.", "min_score": 0.8}}}),
    (MODERATION, {"classify": {"labels": ["spam"], "rubric": {"text": "The reason names the rule broken."}}}),
    (REFUND, {"propose": {"action": {"name": "refund", "params": {"amount_usd": 40}}, "match": "subset",
                          "tolerance": 0.5}}),
    (REFUND, {"propose": {"action": {"name": "refund", "params": {"properties": {"amount_usd": {"maximum": 50}}}},
                          "match": "schema"}}),
    (REFUND, {"propose": {"action": {"name": "refund", "params": {"order_id": "ORD-1", "amount_usd": 4}},
                          "match": "exact"}}),
])
def test_scoring_options_where_they_mean_something_are_accepted(definition, steps):
    assert expected_problems({"steps": steps}, definition) == []


@pytest.mark.parametrize("definition, steps, path, message", [
    (MODERATION, {"classify": {"labels": ["spam"], "output": OUTPUT}}, "expected.steps.classify",
     "not output and labels"),
    (MODERATION, {"classify": {"match": "subset"}}, "expected.steps.classify", "or is graded by a rubric"),
    (MODERATION, {"classify": {"labels": ["spam"], "match": "schema"}}, "expected.steps.classify.match", "match"),
    (MODERATION, {"classify": {"labels": ["spam"], "tolerance": 1}}, "expected.steps.classify.tolerance",
     "tolerance"),
    (MODERATION, {"classify": {"output": {"type": "object"}, "match": "schema", "tolerance": 1}},
     "expected.steps.classify.tolerance", "tolerance"),
    (MODERATION, {"classify": {"output": {"type": "thing"}, "match": "schema"}}, "expected.steps.classify.output.type",
     "JSON Schema"),
    (MODERATION, {"classify": {"output": {"category": "spam", "score": 0.9}}}, "expected.steps.classify.output",
     "required"),  # exact: a whole output, held to the step's output_schema
    (MODERATION, {"classify": {"output": OUTPUT, "match": "fuzzy"}}, "expected.steps.classify.match", "fuzzy"),
    (MODERATION, {"classify": {"output": OUTPUT, "tolerance": -1}}, "expected.steps.classify.tolerance", "minimum"),
    (MODERATION, {"classify": {"rubric": {"text": ""}}}, "expected.steps.classify.rubric.text", "non-empty"),
    (MODERATION, {"classify": {"rubric": {"text": "ok", "min_score": 2}}},
     "expected.steps.classify.rubric.min_score", "maximum"),
    (MODERATION, {"classify": {"rubric": {"text": "ok", "model": "judge"}}}, "expected.steps.classify.rubric",
     "model"),
    (REFUND, {"propose": {"action": {"name": "refund"}, "match": "subset"}}, "expected.steps.propose.match", "match"),
    (REFUND, {"propose": {"abstain": True, "tolerance": 1}}, "expected.steps.propose.tolerance", "tolerance"),
    (REFUND, {"propose": {"action": {"name": "refund", "params": {"order_id": "ORD-1"}}}},
     "expected.steps.propose.action.params", "required"),  # exact params: held to params_schema
])
def test_scoring_options_that_do_not_fit_are_refused_at_their_path(definition, steps, path, message):
    problems = expected_problems({"steps": steps}, definition)
    assert paths(problems) == [path]
    assert message in problems[0]["message"]


def test_a_case_names_registered_scorers_only():
    scorers.scorer("t_expected_known")(lambda o, e, c: True)
    try:
        assert expected_problems({"steps": {"propose": {"abstain": True}}, "scorers": ["t_expected_known"]},
                                 REFUND) == []
        problems = expected_problems({"scorers": ["t_expected_known", "t_nowhere"]}, REFUND)
        assert paths(problems) == ["expected.scorers[1]"]
        assert "t_expected_known" in problems[0]["message"]
        assert paths(expected_problems({"scorers": ["Bad Name"]}, REFUND)) == ["expected.scorers[0]"]
        assert paths(expected_problems({"scorers": []}, REFUND)) == ["expected.scorers"]
    finally:
        scorers.unregister("t_expected_known")


def test_the_published_schema_describes_the_options():
    step = SCHEMA["properties"]["steps"]["additionalProperties"]["properties"]
    assert {"match", "tolerance", "rubric"} <= set(step)
    assert "scorers" in SCHEMA["properties"]
