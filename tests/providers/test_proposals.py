"""Proposals: only allowlisted actions with well-typed params; normalized, then hashed."""
import pytest
from jsonschema import Draft202012Validator

from orchestrator.engine.definitions.proposals import (
    envelope_schema,
    normalize_proposal,
    proposal_hash,
    proposal_problems,
    step_output_schema,
)

DECLARATION = {"actions": [
    {"type": "refund", "params_schema": {
        "type": "object", "required": ["order_id", "amount_usd"],
        "properties": {"order_id": {"type": "string"},
                       "amount_usd": {"type": "number", "exclusiveMinimum": 0},
                       "currency": {"type": "string", "enum": ["USD", "EUR"], "default": "USD"}}}},
    {"type": "decline", "params_schema": {
        "type": "object", "required": ["explanation"],
        "properties": {"explanation": {"type": "string"}}}},
]}
REFUND = {"action_type": "refund", "params": {"order_id": "ORD-1001", "amount_usd": 10.0},
          "evidence": ["the mug arrived chipped"], "rationale": "A defect.", "confidence": 0.9}


def problems(value) -> list[str]:
    return proposal_problems(DECLARATION, normalize_proposal(DECLARATION, value))


def test_an_allowlisted_well_typed_proposal_passes():
    assert problems(REFUND) == []


@pytest.mark.parametrize("change, fragment", [
    ({"action_type": "wire_transfer"}, "'wire_transfer' is not one of ['decline', 'refund']"),
    ({"action_type": "Refund"}, "is not one of"),
    ({"tool": "payments.wire"}, "'tool' was unexpected"),
    ({"risk": {"tier": "low", "requires_approval": False}}, "'risk' was unexpected"),
    ({"params": {"order_id": "ORD-1001", "amount_usd": 10.0, "recipient": "x@evil.example"}},
     "params: Additional properties are not allowed ('recipient' was unexpected)"),
    ({"params": {"order_id": "ORD-1001", "amount_usd": -5}}, "params/amount_usd"),
    ({"params": {"order_id": "ORD-1001", "amount_usd": "10"}}, "is not of type 'number'"),
    ({"params": {"order_id": "ORD-1001", "amount_usd": 1, "currency": "BTC"}}, "params/currency"),
    ({"params": {"explanation": "no"}}, "'order_id' is a required property"),
    ({"confidence": 1.5}, "confidence"),
    ({"evidence": "it broke"}, "evidence"),
])
def test_anything_outside_the_contract_is_rejected(change, fragment):
    found = problems({**REFUND, **change})
    assert found and any(fragment in p for p in found), found


@pytest.mark.parametrize("missing", ["action_type", "params", "evidence", "rationale", "confidence"])
def test_every_envelope_field_is_required(missing):
    value = {k: v for k, v in REFUND.items() if k != missing}
    assert any(f"'{missing}' is a required property" in p for p in problems(value))


@pytest.mark.parametrize("value", [None, [], "refund", 3])
def test_a_reply_that_is_not_an_object_is_rejected(value):
    assert problems(value)


def test_normalization_fills_declared_defaults_and_types_numbers_by_schema():
    value = normalize_proposal(DECLARATION, {**REFUND, "params": {"order_id": "ORD-1001", "amount_usd": 10},
                                             "confidence": 1})
    assert value["params"] == {"order_id": "ORD-1001", "amount_usd": 10.0, "currency": "USD"}
    assert isinstance(value["params"]["amount_usd"], float)
    assert isinstance(value["confidence"], float)


def test_normalization_composes_unicode_so_look_alikes_hash_alike():
    composed = normalize_proposal(DECLARATION, {**REFUND, "params": {"order_id": "ORD-\u00e91", "amount_usd": 1}})
    decomposed = normalize_proposal(DECLARATION, {**REFUND, "params": {"order_id": "ORD-e\u03011", "amount_usd": 1}})
    assert composed == decomposed
    assert proposal_hash(composed) == proposal_hash(decomposed)


def test_keys_that_collide_after_normalization_are_refused():
    with pytest.raises(ValueError, match="after Unicode normalization"):
        normalize_proposal(DECLARATION, {**REFUND, "params": {"caf\u00e9": 1, "cafe\u0301": 2}})


def test_the_hash_is_sha256_of_the_canonical_action_and_params():
    import hashlib
    import json

    value = normalize_proposal(DECLARATION, {**REFUND, "params": {**REFUND["params"],
                                                                  "order_id": "café-1"}})
    # Computed here independently of the code under test: sorted keys, no whitespace, ASCII.
    text = json.dumps({"action_type": "refund", "params": value["params"]}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=True)
    assert "caf\\u00e9-1" in text
    assert proposal_hash(value) == hashlib.sha256(text.encode()).hexdigest()


def test_the_hash_ignores_key_order_and_explanations_but_not_the_effect():
    base = normalize_proposal(DECLARATION, REFUND)
    reordered = normalize_proposal(DECLARATION, {
        "confidence": 0.1, "rationale": "other words", "evidence": [],
        "params": {"amount_usd": 10, "order_id": "ORD-1001"}, "action_type": "refund"})
    bigger = normalize_proposal(DECLARATION, {**REFUND, "params": {"order_id": "ORD-1001", "amount_usd": 10.01}})
    other_order = normalize_proposal(DECLARATION, {**REFUND, "params": {"order_id": "ORD-1002", "amount_usd": 10}})
    assert proposal_hash(reordered) == proposal_hash(base)
    assert len({proposal_hash(base), proposal_hash(bigger), proposal_hash(other_order)}) == 3


def test_the_model_sees_one_branch_per_allowed_action_with_its_description():
    schema = envelope_schema({"actions": [{**DECLARATION["actions"][0], "description": "Give money back."},
                                          DECLARATION["actions"][1]]})
    branches = schema["anyOf"]
    assert [b["properties"]["action_type"] for b in branches] == [{"const": "refund"}, {"const": "decline"}]
    assert branches[0]["description"] == "Give money back."
    assert all(b["additionalProperties"] is False for b in branches)


# --- the contract's edges (from mutation testing: each of these was a surviving mutant) -------


@pytest.mark.parametrize("change, problem", [
    ({"evidence": ["x"] * 21}, "evidence: ['x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', "
                               "'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x'] is too long"),
    ({"evidence": [""]}, "evidence/0: '' should be non-empty"),
    ({"evidence": [7]}, "evidence/0: 7 is not of type 'string'"),
    ({"evidence": ["x" * 4001]}, "is too long"),
    ({"rationale": ""}, "rationale: '' should be non-empty"),
    ({"rationale": 7}, "rationale: 7 is not of type 'string'"),
    ({"rationale": "x" * 4001}, "is too long"),
    ({"confidence": -0.01}, "confidence: -0.01 is less than the minimum of 0"),
    ({"confidence": "high"}, "confidence: 'high' is not of type 'number'"),
])
def test_the_explanations_are_bounded(change, problem):
    found = problems({**REFUND, **change})
    assert any(p == problem or (problem == "is too long" and p.endswith(problem)) for p in found), found


@pytest.mark.parametrize("change", [
    {"evidence": ["x"] * 20}, {"evidence": ["x"]}, {"evidence": ["x" * 4000]}, {"rationale": "x"},
    {"rationale": "x" * 4000}, {"confidence": 0}, {"confidence": 1},
])
def test_the_explanations_at_their_bounds_pass(change):
    assert problems({**REFUND, **change}) == []


def test_a_problem_at_the_root_and_a_nested_one_name_where_they_are():
    assert problems(3) == ["(root): 3 is not of type 'object'"]
    nested = {"actions": [{"type": "ship", "params_schema": {
        "type": "object", "properties": {"box": {"type": "object", "properties": {
            "kg": {"type": "number"}}}}}}]}
    value = {**REFUND, "action_type": "ship", "params": {"box": {"kg": "heavy"}}}
    assert proposal_problems(nested, value) == ["params/box/kg: 'heavy' is not of type 'number'"]


def test_params_must_be_an_object_whatever_the_actions_schema():
    open_schema = {"actions": [{"type": "note", "params_schema": {}}]}
    value = {**REFUND, "action_type": "note", "params": "anything"}
    assert proposal_problems(open_schema, value) == ["params: 'anything' is not of type 'object'"]


def test_integers_are_typed_by_the_schema_inside_lists_too():
    declaration = {"actions": [{"type": "split", "params_schema": {"type": "object", "properties": {
        "parts": {"type": "array", "items": {"type": "integer"}},
        "weights": {"type": "array", "items": {"type": "number"}},
        "n": {"type": "integer"}}}}]}
    value = {**REFUND, "action_type": "split",
             "params": {"parts": [1.0, 2.0], "weights": [1, 2], "n": 3.0, "other": [1.0]}}
    params = normalize_proposal(declaration, value)["params"]
    assert params == {"parts": [1, 2], "weights": [1.0, 2.0], "n": 3, "other": [1.0]}
    assert [type(p) for p in params["parts"]] == [int, int]
    assert [type(w) for w in params["weights"]] == [float, float] and type(params["n"]) is int
    assert type(params["other"][0]) is float  # not in the schema: left as it came


def test_an_action_type_that_is_not_a_string_is_left_for_the_check_to_refuse():
    value = {**REFUND, "action_type": ["refund"]}
    assert normalize_proposal(DECLARATION, dict(value))["params"] == REFUND["params"]
    assert problems(value)


def test_the_envelope_the_model_sees_accepts_a_proposal_and_refuses_what_the_check_refuses():
    schema = envelope_schema({"actions": [
        {"type": "refund", "description": "Refund an order.", "params_schema": DECLARATION["actions"][0]["params_schema"]},
        {"type": "decline", "params_schema": DECLARATION["actions"][1]["params_schema"]}]})
    validator = Draft202012Validator(schema)
    assert validator.is_valid(REFUND)
    assert [b["description"] for b in schema["anyOf"]] == ["Refund an order.", ""]
    for bad in (None, [], {k: v for k, v in REFUND.items() if k != "rationale"},
                {**REFUND, "params": {"order_id": 1, "amount_usd": 10.0}},
                {**REFUND, "params": {"explanation": "no"}}, {**REFUND, "extra": 1}):
        assert not validator.is_valid(bad), bad


def test_a_proposing_steps_output_is_the_proposal_its_hash_and_its_risk():
    validator = Draft202012Validator(step_output_schema(DECLARATION))
    good = {"proposal": REFUND, "proposal_hash": "a" * 64,
            "risk": {"tier": "high", "reasons": ["amount"], "requires_approval": True}}
    assert validator.is_valid(good)
    risk = good["risk"]
    for bad in ({k: v for k, v in good.items() if k != "proposal_hash"},
                {k: v for k, v in good.items() if k != "risk"},
                {k: v for k, v in good.items() if k != "proposal"},
                {**good, "extra": 1}, {**good, "proposal_hash": "A" * 64},
                {**good, "proposal_hash": "a" * 63}, {**good, "proposal_hash": 7},
                {**good, "proposal": {**REFUND, "action_type": "wire"}}, {**good, "risk": []},
                {**good, "risk": {**risk, "tier": "extreme"}}, {**good, "risk": {**risk, "reasons": [1]}},
                {**good, "risk": {**risk, "reasons": "amount"}},
                {**good, "risk": {**risk, "requires_approval": "yes"}},
                {**good, "risk": {**risk, "extra": 1}},
                {**good, "risk": {k: v for k, v in risk.items() if k != "tier"}},
                {**good, "risk": {k: v for k, v in risk.items() if k != "reasons"}},
                {**good, "risk": {k: v for k, v in risk.items() if k != "requires_approval"}}):
        assert not validator.is_valid(bad), bad
    for tier in ("low", "medium", "critical"):
        assert validator.is_valid({**good, "risk": {**risk, "tier": tier}})


def test_a_step_output_that_is_not_an_object_is_refused():
    validator = Draft202012Validator(step_output_schema(DECLARATION))
    for bad in ([], "proposal", 3, None):
        assert not validator.is_valid(bad), bad


@pytest.mark.parametrize("params, problem", [
    ({"box": "heavy"}, "params/box: 'heavy' is not of type 'object'"),
    ({"parts": "12"}, "params/parts: '12' is not of type 'array'"),
])
def test_a_param_of_the_wrong_shape_is_left_for_the_check_to_refuse(params, problem):
    declaration = {"actions": [{"type": "pack", "params_schema": {"type": "object", "properties": {
        "box": {"type": "object", "properties": {"kg": {"type": "number"}}},
        "parts": {"type": "array", "items": {"type": "integer"}}}}}]}
    value = normalize_proposal(declaration, {**REFUND, "action_type": "pack", "params": params})
    assert value["params"] == params
    assert proposal_problems(declaration, value) == [problem]
