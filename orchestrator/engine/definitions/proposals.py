"""Typed proposals: what an agent step may propose, checked, normalized and hashed by our code.

A step that declares `proposal.actions` (the allowlist) asks the model for exactly one
proposal: `{action_type, params, evidence, rationale, confidence}`. This module owns

* the contract shown to the model (`envelope_schema`),
* the check of a reply against it (`proposal_problems`): unknown fields, an `action_type`
  outside the allowlist, params its action's `params_schema` rejects (unknown params too),
* normalization (`normalize_proposal`) and the canonical hash (`proposal_hash`).

It decides nothing and executes nothing: a proposal is data. The action is performed by a
tool step the definition names; the risk tier is computed in `risk.py`. Nothing here reads
the database or calls a model.
"""
import unicodedata

from jsonschema import Draft202012Validator

from ..hashing import digest_of
from ..output_schemas import strict
from .format import RISK_TIERS as TIERS

FIELDS = ("action_type", "params", "evidence", "rationale", "confidence")
MAX_EVIDENCE = 20
MAX_TEXT = 4000


def actions_of(declaration: dict) -> dict[str, dict]:
    """The allowlist: action type -> its declaration."""
    return {action["type"]: action for action in declaration.get("actions", [])}


def _explanations() -> dict:
    return {
        "evidence": {
            "type": "array", "maxItems": MAX_EVIDENCE,
            "items": {"type": "string", "minLength": 1, "maxLength": MAX_TEXT},
            "description": "Facts from the input that support the proposal, quoted.",
        },
        "rationale": {"type": "string", "minLength": 1, "maxLength": MAX_TEXT,
                      "description": "Why this action, in a few sentences."},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1,
                       "description": "How sure you are, from 0 to 1."},
    }


def _branch(action: dict) -> dict:
    return {
        "type": "object",
        "description": action.get("description", ""),
        "required": list(FIELDS),
        "additionalProperties": False,
        "properties": {
            "action_type": {"const": action["type"]},
            "params": action["params_schema"],
            **_explanations(),
        },
    }


def envelope_schema(declaration: dict) -> dict:
    """The JSON Schema of one proposal: one branch per allowed action type."""
    return {"type": "object", "anyOf": [_branch(a) for a in declaration.get("actions", [])]}


def _shape_schema(declaration: dict) -> dict:
    """The envelope with params left open: the first of the two checks."""
    return {
        "type": "object",
        "required": list(FIELDS),
        "properties": {
            "action_type": {"enum": sorted(actions_of(declaration))},
            "params": {"type": "object"},
            **_explanations(),
        },
    }


def step_output_schema(declaration: dict) -> dict:
    """The schema of a proposing step's output: the proposal plus what our code adds."""
    return {
        "type": "object",
        "required": ["proposal", "proposal_hash", "risk"],
        "additionalProperties": False,
        "properties": {
            "proposal": envelope_schema(declaration),
            "proposal_hash": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
            "risk": {
                "type": "object",
                "required": ["tier", "reasons", "requires_approval"],
                "additionalProperties": False,
                "properties": {
                    "tier": {"enum": list(TIERS)},
                    "reasons": {"type": "array", "items": {"type": "string"}},
                    "requires_approval": {"type": "boolean"},
                },
            },
        },
    }


def _errors(schema: dict, value: object, prefix: str = "") -> list[str]:
    validator = Draft202012Validator(strict(schema))
    found = sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{_where(prefix, e.absolute_path)}: {e.message}" for e in found]


def _where(prefix: str, path) -> str:
    inner = "/".join(map(str, path))
    if prefix:
        return f"{prefix}/{inner}" if inner else prefix
    return inner or "(root)"


def proposal_problems(declaration: dict, value: object) -> list[str]:
    """Every reason `value` is not an allowed, well-typed proposal ([] when it is).

    Two checks, so each message names the real problem: the envelope (fields, types, the
    allowlist), then the params against the chosen action's `params_schema`. Both reject
    fields they do not list.
    """
    problems = _errors(_shape_schema(declaration), value)
    if problems:
        return problems
    action = actions_of(declaration)[value["action_type"]]
    return _errors(action["params_schema"], value["params"], prefix="params")


def _nfc(value: object) -> object:
    """NFC for every string and key, so look-alike spellings compare and hash alike."""
    if isinstance(value, str):
        return unicodedata.normalize("NFC", value)
    if isinstance(value, list):
        return [_nfc(item) for item in value]
    if isinstance(value, dict):
        result = {}
        for key, item in value.items():
            name = unicodedata.normalize("NFC", key)
            if name in result:
                raise ValueError(f"two fields are named {name!r} after Unicode normalization")
            result[name] = _nfc(item)
        return result
    return value


def _numbers(value: object, schema: object) -> object:
    """Numbers as their schema types them: `number` -> float, `integer` -> int.

    So 15 and 15.0 hash alike, and risk rules (CEL, strictly typed) always compare a `number`
    param as a double.
    """
    if not isinstance(schema, dict):
        return value
    kind = schema.get("type")
    if kind == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict) and isinstance(schema.get("properties"), dict):
        return {k: _numbers(v, schema["properties"].get(k)) for k, v in value.items()}
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_numbers(item, schema["items"]) for item in value]
    return value


def normalize_proposal(declaration: dict, value: object) -> object:
    """The normalized form of a reply: NFC strings, schema-typed numbers, param defaults.

    Run before `proposal_problems`, so what is validated is exactly what flows on. Raises
    ValueError when normalization would merge two fields.
    """
    value = _nfc(value)
    if not isinstance(value, dict):
        return value
    if isinstance(value.get("confidence"), int) and not isinstance(value["confidence"], bool):
        value["confidence"] = float(value["confidence"])
    kind = value.get("action_type")
    action = actions_of(declaration).get(kind) if isinstance(kind, str) else None
    if action is None or not isinstance(value.get("params"), dict):
        return value
    params_schema = action["params_schema"]
    properties = params_schema.get("properties") or {}
    for name, schema in properties.items():
        if isinstance(schema, dict) and "default" in schema and name not in value["params"]:
            value["params"][name] = _nfc(schema["default"])
    value["params"] = _numbers(value["params"], params_schema)
    return value


def proposal_hash(proposal: dict) -> str:
    """SHA-256 of the canonical {action_type, params}: what would be executed.

    Evidence, rationale and confidence explain a proposal but do not change its effect, so
    they are not hashed; any change of the action or a parameter changes the hash.
    """
    effect = {"action_type": proposal["action_type"], "params": proposal["params"]}
    return digest_of(effect)
