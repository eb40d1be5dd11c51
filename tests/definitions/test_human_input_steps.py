"""A human_input step at save (docs/definitions.md, "human_input"): a group and a form
that can be drawn (a valid JSON Schema of an object of flat fields, its `required` naming
fields), its instructions and evidence templates checked like every other, an escalation that
comes before the deadline and goes to another group, none of the fields of a step that runs
something; later steps' reads of its output (`answer`, `answered_by`, `abstained`) checked
against its form. What saves is normalized with its defaults."""

from __future__ import annotations

import pytest

from orchestrator.engine.definitions import normalize_definition
from orchestrator.engine.definitions.limits import MAX_TIMEOUT_S

FORM = {"type": "object", "required": ["iban"],
        "properties": {"iban": {"type": "string", "minLength": 15, "title": "IBAN"},
                       "confirmed": {"type": "boolean"},
                       "amount": {"type": "number", "minimum": 0},
                       "copies": {"type": "integer"},
                       "source": {"enum": ["records", "phone"]}}}


def definition(*, then: dict | None = None, **ask) -> dict:
    step = {"name": "ask", "type": "human_input", "group": "clerks", "form": FORM,
            "after": ["pick"], **ask}
    return {
        "name": "asker",
        "input_schema": {"type": "object", "required": ["doc"],
                         "properties": {"doc": {"type": "string"}}},
        "steps": [
            {"name": "pick", "type": "tool", "tool": "pager.page", "params": {"message": "hi"},
             "output_schema": {"type": "object", "required": ["vendor"],
                               "properties": {"vendor": {"type": "string"}}}},
            step,
            *([then] if then else []),
        ],
    }


def use(params: dict, when: str | None = None) -> dict:
    return {"name": "use", "type": "tool", "tool": "pager.page", "after": ["ask"],
            "params": params, **({"when": when} if when else {})}


@pytest.mark.parametrize(
    "ask",
    [
        {},
        {"assignee": "sam", "deadline_s": MAX_TIMEOUT_S, "on_timeout": "abstain"},
        {"instructions": "Find the IBAN of {{ steps.pick.output.vendor }}.",
         "evidence": {"document": "{{ input.doc }}", "vendor": "{{ steps.pick.output.vendor }}"}},
        {"escalate_to": "leads", "escalate_after_s": 60, "deadline_s": 120},
        {"allow_abstain": True, "separation_of_duties": True, "description": "ask a clerk"},
    ],
)
def test_a_human_input_that_saves(validate, ask):
    assert validate(definition(**ask)) == []


@pytest.mark.parametrize(
    ("ask", "path", "message"),
    [
        ({"group": ""}, "steps[1].group", "must not be empty"),
        ({"form": {"type": "array"}}, "steps[1].form.type", "a form's schema must have type: object"),
        ({"form": {"type": "object", "properties": {}}}, "steps[1].form.properties",
         "at least one field"),
        ({"form": {"type": "object", "properties": {"a": {"type": "object"}}}},
         "steps[1].form.properties.a.type", "a form cannot show nested objects or lists"),
        ({"form": {"type": "object", "properties": {"a": {"type": "string", "items": {}}}}},
         "steps[1].form.properties.a.items", "'items' is not used by a form field"),
        ({"form": {"type": "object", "required": ["b"], "properties": {"a": {"type": "string"}}}},
         "steps[1].form.required[0]", "'b' is required but is not a field"),
        ({"form": {"type": "object", "properties": {"a": {"type": "strang"}}}},
         "steps[1].form.properties.a.type", "unknown JSON Schema type 'strang'"),
        ({"evidence": {"doc": "{{ input.nothing }}"}}, "steps[1].evidence.doc",
         "template reads something the declared shapes do not have"),
        ({"instructions": "{{ steps.ask.output }}"}, "steps[1].instructions",
         "cannot read its own output"),
        ({"escalate_to": "leads"}, "steps[1].escalate_after_s",
         "escalate_to and escalate_after_s go together"),
        ({"escalate_after_s": 60}, "steps[1].escalate_to",
         "escalate_to and escalate_after_s go together"),
        ({"escalate_to": "leads", "escalate_after_s": 600, "deadline_s": 600},
         "steps[1].escalate_after_s", "must be less than deadline_s"),
        ({"escalate_to": "clerks", "escalate_after_s": 60}, "steps[1].escalate_to",
         "the step's own group"),
        ({"deadline_s": 0}, "steps[1].deadline_s", "must be > 0"),
        ({"on_timeout": "skip"}, "steps[1].on_timeout", "must be one of"),
        ({"timeout_s": 60}, "steps[1].timeout_s", "unknown field 'timeout_s'"),
        ({"output_schema": {"type": "object"}}, "steps[1].output_schema", "unknown field"),
    ],
)
def test_a_human_input_that_is_refused_says_where_and_why(validate, ask, path, message):
    problems = validate(definition(**ask))
    assert any(p.path == path and message in p.message for p in problems), problems


def test_a_human_input_needs_a_group_and_a_form(validate):
    doc = definition()
    del doc["steps"][1]["group"], doc["steps"][1]["form"]
    paths = {(p.path, p.message) for p in validate(doc)}
    assert ("steps[1]", "missing required field 'group'") in paths
    assert ("steps[1]", "missing required field 'form'") in paths


def test_later_steps_read_the_answer_by_the_form_s_fields(validate):
    reads_a_field = use({"message": "{{ steps.ask.output.answer.iban }} by "
                                    "{{ steps.ask.output.answered_by }}"},
                        when="!steps.ask.output.abstained")
    assert validate(definition(then=reads_a_field)) == []

    typo = use({"message": "{{ steps.ask.output.answer.ibn }}"})
    problems = validate(definition(then=typo))
    assert [p.path for p in problems] == ["steps[2].params.message"], problems
    assert "declared shapes do not have" in problems[0].message

    # The branch that is not taken on an abstention is the one that reads the answer: a typo
    # there is found too.
    guarded = use({"message": "{{ steps.ask.output.answer.ibn }}"},
                  when="!steps.ask.output.abstained")
    assert [p.path for p in validate(definition(then=guarded))] == ["steps[2].params.message"]

    optional = use({"message": "{{ steps.ask.output.answer.amount }}"})
    problems = validate(definition(then=optional))
    assert [p.path for p in problems] == ["steps[2].params.message"], problems
    assert "may be absent" in problems[0].message


def test_a_human_input_is_normalized_with_its_defaults_and_nothing_of_a_step_that_runs(validate):
    step = normalize_definition(definition())["steps"][1]
    assert {k: step[k] for k in ("deadline_s", "on_timeout", "allow_abstain",
                                 "separation_of_duties", "evidence", "description")} == {
        "deadline_s": 86400, "on_timeout": "fail", "allow_abstain": False,
        "separation_of_duties": False, "evidence": {}, "description": ""}
    assert "timeout_s" not in step and "retry" not in step
    normalized = normalize_definition(definition())
    assert validate(normalized) == []
    assert normalize_definition(normalized) == normalized


def test_a_human_input_written_in_python_is_the_step_its_yaml_is(validate):
    from stepwise_client.builder import Workflow

    doc = definition(allow_abstain=True, evidence={"document": "{{ input.doc }}"})
    wf = Workflow("asker", input_schema=doc["input_schema"])
    pick = wf.tool("pick", **{k: v for k, v in doc["steps"][0].items() if k not in ("name", "type")})
    wf.human_input("ask", group="clerks", form=FORM, allow_abstain=True,
                   evidence={"document": "{{ input.doc }}"}, after=[pick])
    assert wf.to_dict() == doc
    assert validate(wf.to_dict()) == []
