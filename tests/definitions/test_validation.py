"""validate_definition: one call returns every problem, each with its path."""

from __future__ import annotations

import pytest

from orchestrator.engine.definitions import Problem

from .examples import TOOLS


def step(doc: dict, name: str) -> dict:
    return next(s for s in doc["steps"] if s["name"] == name)


def paths(problems: list[Problem]) -> list[str]:
    return [problem.path for problem in problems]


def assert_problem(problems: list[Problem], path: str, *fragments: str) -> None:
    matching = [p for p in problems if p.path == path and all(f in p.message for f in fragments)]
    assert matching, f"no problem at {path!r} containing {fragments}; got: {problems}"


def test_support_workflow_is_valid(support_workflow, validate):
    assert validate(support_workflow) == []


def test_cycle_unknown_after_and_bad_expression_are_all_reported_in_one_call(
    support_workflow, validate
):
    step(support_workflow, "classify")["after"] = ["send"]
    step(support_workflow, "research")["after"] = ["classify", "triage"]
    step(support_workflow, "fetch_history")["when"] = "steps.classify.output.category =="

    problems = validate(support_workflow)

    assert_problem(problems, "steps[0].after", "cycle: classify -> research -> draft")
    assert_problem(problems, "steps[1].after[1]", "unknown step 'triage'")
    assert_problem(problems, "steps[2].when", "CEL syntax error")
    assert paths(problems) == sorted(paths(problems), key=lambda p: p.split(".")[0]), problems


def test_problems_come_in_document_order(support_workflow, validate):
    step(support_workflow, "send")["foo"] = 1
    step(support_workflow, "classify")["bar"] = 2
    support_workflow["on_error"] = "explode"

    assert paths(validate(support_workflow)) == ["on_error", "steps[0].bar", "steps[5].foo"]


@pytest.mark.parametrize(
    "doc",
    [None, 3, "name: x", [], ["a"], True],
    ids=["none", "int", "string", "empty-list", "list", "bool"],
)
def test_a_document_that_is_not_a_mapping_is_one_root_problem(doc, validate):
    [problem] = validate(doc)
    assert problem.path == ""
    assert "must be a mapping" in problem.message


def test_non_string_keys_are_reported_instead_of_crashing(support_workflow, validate):
    step(support_workflow, "send")["params"][1] = "x"
    assert_problem(validate(support_workflow), "steps[5].params", "key 1 must be a string")


def test_non_json_values_are_reported(support_workflow, validate):
    support_workflow["description"] = {1, 2}
    assert_problem(validate(support_workflow), "description", "set values are not allowed")


def test_problems_are_frozen_values():
    problem = Problem("steps[0]", "missing required field 'model'")
    with pytest.raises(AttributeError):
        problem.path = "x"  # type: ignore[misc]
    assert problem == Problem("steps[0]", "missing required field 'model'")


def test_tools_registry_is_used_for_params(support_workflow, validate):
    assert "http.get" in TOOLS
    step(support_workflow, "fetch_history")["params"] = {"url": "https://x", "verb": "GET"}
    assert_problem(validate(support_workflow), "steps[2].params", "tool 'http.get'", "'verb'")
