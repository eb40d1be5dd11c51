"""Loop steps in definitions: a loop is refused, with a path, when it has no bound, when its
`until` reads a step outside its body, or when its body leaves the body; normalizing fills the
body's defaults; the scheduler's graph finds an iteration's step by its run name."""

from __future__ import annotations

import copy

import pytest

from orchestrator.engine.definitions import normalize_definition
from orchestrator.engine.definitions.limits import MAX_LOOP_ITERATIONS
from orchestrator.engine.scheduler import graph_of

AGENT_OUT = {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}}
VERDICT = {"type": "object", "required": ["approved"], "properties": {"approved": {"type": "boolean"}}}

GOOD = {
    "name": "revise",
    "input_schema": {"type": "object", "required": ["topic"], "properties": {"topic": {"type": "string"}}},
    "steps": [
        {"name": "outline", "type": "agent", "model": "fast", "prompt": "{{ input.topic }}",
         "output_schema": AGENT_OUT},
        {"name": "refine", "type": "loop", "after": ["outline"], "max_iterations": 3,
         "input": {"outline": "{{ steps.outline.output.text }}"},
         "until": "steps.critique.output.approved",
         "body": [
             {"name": "draft", "type": "agent", "model": "fast", "output_schema": AGENT_OUT,
              "prompt": "{{ iteration.input.outline }} round {{ iteration.number }}"},
             {"name": "critique", "type": "agent", "model": "fast", "after": ["draft"],
              "output_schema": VERDICT, "prompt": "{{ steps.draft.output.text }}"},
         ]},
        {"name": "publish", "type": "tool", "tool": "email.send", "after": ["refine"],
         "params": {"to": "a@example.com", "subject": "s", "body": "{{ steps.refine.output }}"}},
    ],
}


@pytest.fixture
def doc() -> dict:
    return copy.deepcopy(GOOD)


def problems_of(validate, doc) -> dict[str, str]:
    return {p.path: p.message for p in validate(doc)}


def test_a_bounded_loop_is_valid(validate, doc):
    assert validate(doc) == []


@pytest.mark.parametrize(("change", "path", "fragment"), [
    (lambda loop: loop.pop("max_iterations"), "steps[1]", "missing required field 'max_iterations'"),
    (lambda loop: loop.update(max_iterations=0), "steps[1].max_iterations", "must be >= 1"),
    (lambda loop: loop.update(max_iterations=MAX_LOOP_ITERATIONS + 1), "steps[1].max_iterations",
     f"must be <= {MAX_LOOP_ITERATIONS}"),
    (lambda loop: loop.pop("until"), "steps[1]", "missing required field 'until'"),
    (lambda loop: loop.update(until="steps.outline.output.text == ''"), "steps[1].until",
     "steps.outline is not available: until reads only the loop's body steps"),
    (lambda loop: loop.update(until="steps.publish.state == 'completed'"), "steps[1].until",
     "until reads only the loop's body steps"),
    (lambda loop: loop.update(until="item > 1"), "steps[1].until", "unknown variable 'item'"),
    (lambda loop: loop["body"][0].update(after=["outline"]), "steps[1].body[0].after[0]",
     "unknown step 'outline'"),
    (lambda loop: loop["body"][1].update(prompt="{{ steps.outline.output.text }}"),
     "steps[1].body[1].prompt", "unknown step 'outline'"),
    (lambda loop: loop["body"][0].update(name="outline"), "steps[1].body[0].name", "already used"),
    (lambda loop: loop["body"][0].update(name="d" * 62), "steps[1].body[0].name",
     "to leave room for its iteration number"),
    (lambda loop: loop["body"].append({"name": "ask", "type": "human_gate", "approvers": "leads"}),
     "steps[1].body[2].type", "must be one of agent, tool, router"),
    (lambda loop: loop.update(body=[]), "steps[1].body", "must not be empty"),
])
def test_a_bad_loop_is_refused_with_a_path(validate, doc, change, path, fragment):
    change(doc["steps"][1])
    problems = problems_of(validate, doc)
    assert path in problems and fragment in problems[path], problems


def test_a_body_step_is_invisible_outside_its_loop(validate, doc):
    doc["steps"][2]["params"]["body"] = "{{ steps.draft.output.text }}"
    assert "unknown step 'draft'" in problems_of(validate, doc)["steps[2].params.body"]


def test_normalizing_fills_the_body_and_the_graph_resolves_an_iteration_by_name(doc):
    normalized = normalize_definition(doc)
    loop = normalized["steps"][1]
    assert loop["timeout_s"] == 3600 and loop["body"][0]["retry"]["max_attempts"] == 1
    graph = graph_of(normalized)
    assert graph.order == ("outline", "refine", "publish")
    assert graph.bodies["refine"].order == ("draft", "critique")
    assert graph.steps["critique[3]"] is graph.steps["critique"]
    with pytest.raises(KeyError):
        graph.steps["nothing[1]"]
