"""The definition format for fail-safe AI steps: repair bound, proposals, risk rules, llm routers."""
import copy

import pytest

from orchestrator.engine.definitions import normalize_definition, validate_definition
from orchestrator.engine.definitions.format import definition_format_schema
from tests.factories import example_definition

TOOLS = {"shop.order": {"type": "object"}, "shop.refund": {"type": "object"},
         "email.send": {"type": "object"}, "core.echo": {"type": "object"}}
MODELS = ("fast", "deep")


def problems(doc) -> dict[str, str]:
    return {p.path: p.message for p in validate_definition(doc, tools=TOOLS, models=MODELS)}


@pytest.fixture
def refund() -> dict:
    return copy.deepcopy(example_definition("refund-proposal"))


def propose(doc: dict) -> dict:
    return doc["steps"][1]


def llm_router() -> dict:
    return {"name": "triage", "input_schema": {"type": "object"}, "steps": [
        {"name": "route", "type": "router", "strategy": "llm", "model": "fast",
         "prompt": "Route: {{ input.body }}",
         "routes": [{"name": "billing", "description": "Money matters.", "then": ["a"]}],
         "default": {"name": "other", "then": ["b"]},
         "script": [{"output": {"route": "billing"}}]},
        {"name": "a", "type": "tool", "tool": "core.echo", "after": ["route"]},
        {"name": "b", "type": "tool", "tool": "core.echo", "after": ["route"]},
    ]}


def test_the_refund_example_and_an_llm_router_are_valid(refund):
    assert problems(refund) == {}
    assert problems(llm_router()) == {}


def test_normalization_writes_the_new_defaults_and_stays_valid(refund):
    normalized = normalize_definition(refund)
    step = propose(normalized)
    assert step["repair_attempts"] == 2  # written by the author, kept
    assert normalize_definition(llm_router())["steps"][0]["script"] == [{"output": {"route": "billing"}}]
    decline = step["proposal"]["actions"][1]
    assert decline["risk"] == {"tier": "low", "rules": []}
    assert step["proposal"]["approval_at"] == "medium" and step["proposal"]["min_confidence"] == 0.6
    assert problems(normalized) == {}
    assert normalize_definition(normalized) == normalized
    plain = {"name": "x", "input_schema": {"type": "object"}, "steps": [
        {"name": "a", "type": "agent", "model": "fast", "prompt": "p", "output_schema": {"type": "object"}}]}
    assert normalize_definition(plain)["steps"][0]["repair_attempts"] == 1


CASES = [
    ("negative-repair", lambda d: propose(d).update(repair_attempts=-1),
     "steps[1].repair_attempts", "must be >= 0"),
    ("proposal-with-output-schema", lambda d: propose(d).update(output_schema={"type": "object"}),
     "steps[1].output_schema", "derived from the actions"),
    ("no-actions", lambda d: propose(d)["proposal"].update(actions=[]),
     "steps[1].proposal.actions", "must not be empty"),
    ("bad-action-type", lambda d: propose(d)["proposal"]["actions"][0].update(type="Refund Now"),
     "steps[1].proposal.actions[0].type", "not a valid name"),
    ("duplicate-action", lambda d: propose(d)["proposal"]["actions"][1].update(type="refund"),
     "steps[1].proposal.actions[1].type", "duplicate action type 'refund'"),
    ("params-not-object", lambda d: propose(d)["proposal"]["actions"][1].update(
        params_schema={"type": "string"}),
     "steps[1].proposal.actions[1].params_schema", "type: object"),
    ("bad-tier", lambda d: propose(d)["proposal"]["actions"][0]["risk"].update(tier="severe"),
     "steps[1].proposal.actions[0].risk.tier", "low, medium, high, critical"),
    ("bad-approval-at", lambda d: propose(d)["proposal"].update(approval_at="never"),
     "steps[1].proposal.approval_at", "low, medium, high, critical"),
    ("confidence-over-one", lambda d: propose(d)["proposal"].update(min_confidence=2),
     "steps[1].proposal.min_confidence", "2"),
    ("undeclared-amount-param", lambda d: propose(d)["proposal"]["actions"][0]["risk"]["amount"].update(
        param="total"),
     "steps[1].proposal.actions[0].risk.amount.param", "not declared"),
    ("recipient-without-allowed", lambda d: propose(d)["proposal"]["actions"][1]["risk"].update(
        recipient={"param": "explanation"}),
     "steps[1].proposal.actions[1].risk.recipient", "'allowed'"),
    ("rule-unknown-variable", lambda d: propose(d)["proposal"]["actions"][0]["risk"]["rules"][0].update(
        when="model.says_ok"),
     "steps[1].proposal.actions[0].risk.rules[0].when", "unknown variable 'model'"),
    ("rule-bad-cel", lambda d: propose(d)["proposal"]["actions"][0]["risk"]["rules"][0].update(when="1 +"),
     "steps[1].proposal.actions[0].risk.rules[0].when", "invalid expression"),
    ("unknown-risk-field", lambda d: propose(d)["proposal"]["actions"][0]["risk"].update(skip_approval=True),
     "steps[1].proposal.actions[0].risk.skip_approval", "unknown field"),
    ("scripted-unlisted-action", lambda d: propose(d)["script"][0]["output"].update(action_type="wire"),
     "steps[1].script[0].output", "'wire' is not one of"),
    ("scripted-extra-param", lambda d: propose(d)["script"][0]["output"]["params"].update(to="x@y.z"),
     "steps[1].script[0].output", "'to' was unexpected"),
]


@pytest.mark.parametrize("edit, path, fragment", [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_proposal_problems_are_reported_with_their_path(refund, edit, path, fragment):
    edit(refund)
    found = problems(refund)
    assert path in found and fragment in found[path], found


ROUTER_CASES = [
    ("llm-without-model", lambda r: r.pop("model"), "steps[0]", "missing required field 'model'"),
    ("llm-without-prompt", lambda r: r.pop("prompt"), "steps[0]", "missing required field 'prompt'"),
    ("llm-unknown-model", lambda r: r.update(model="gpt-9"), "steps[0].model", "unknown model 'gpt-9'"),
    ("llm-route-without-description", lambda r: r["routes"][0].pop("description"),
     "steps[0].routes[0]", "missing required field 'description'"),
    ("llm-route-with-when", lambda r: r["routes"][0].update(when="true"),
     "steps[0].routes[0].when", "only used with strategy: rules"),
    ("llm-with-score", lambda r: r.update(score="1"), "steps[0].score", "only used with strategy: score"),
    ("model-on-rules-router", lambda r: r.update(strategy="rules", routes=[
        {"name": "billing", "when": "true", "then": ["a"]}]), "steps[0].model", "only used with strategy: llm"),
    ("llm-prompt-bad-variable", lambda r: r.update(prompt="{{ secrets.key }}"),
     "steps[0].prompt", "unknown template variable 'secrets'"),
    ("llm-script-bad-when", lambda r: r["script"][0].update(when="nope.x"),
     "steps[0].script[0].when", "unknown variable 'nope'"),
]


@pytest.mark.parametrize("edit, path, fragment", [pytest.param(*c[1:], id=c[0]) for c in ROUTER_CASES])
def test_llm_router_problems_are_reported_with_their_path(edit, path, fragment):
    doc = llm_router()
    edit(doc["steps"][0])
    found = problems(doc)
    assert path in found and fragment in found[path], found


def test_route_descriptions_are_allowed_on_every_strategy():
    doc = llm_router()
    doc["steps"][0].update(strategy="rules")
    for key in ("model", "prompt", "script"):
        del doc["steps"][0][key]
    doc["steps"][0]["routes"][0]["when"] = "true"
    assert problems(doc) == {}


def test_the_new_fields_are_in_the_published_format_schema():
    defs = definition_format_schema()["$defs"]
    assert "repair_attempts" in defs["agent_step"]["properties"]
    assert "repair_attempts" in defs["map_item"]["allOf"][0]["then"]["properties"]
    assert "proposal" not in defs["map_item"]["allOf"][0]["then"]["properties"]
    assert {"proposal", "action", "action_risk", "llm_route"} <= set(defs)
    assert "llm" in defs["router_step"]["properties"]["strategy"]["enum"]
