"""Proposals: only allowlisted actions with well-typed params; normalized, then hashed."""
import pytest

from orchestrator.definitions.proposals import (
    envelope_schema,
    normalize_proposal,
    proposal_hash,
    proposal_problems,
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
