"""Output validation shared by executors and proposals: extra fields are rejected, every error is
reported. Pure: no database, no network."""
import copy
import json
from functools import lru_cache

from jsonschema import Draft202012Validator

from .retry import StepError
from .text import text_problem

COMBINATORS = frozenset({"allOf", "anyOf", "oneOf", "not", "if", "then", "else",
                         "dependentSchemas"})


def strict(schema: dict) -> dict:
    """A copy of `schema` where every object that lists properties forbids unlisted ones."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node:
                node["additionalProperties"] = False
            for key, value in node.items():
                # Closing a branch of a combinator would change what the whole accepts (an
                # allOf of closed objects accepts nothing); those stay as the author wrote them.
                if key not in COMBINATORS:
                    walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> Draft202012Validator:
    return Draft202012Validator(strict(json.loads(schema_json)))


def validate_output(schema: dict | None, output: object) -> None:
    """Raise StepError('invalid_output') listing every violation of `schema` by `output`, or
    naming the first string in it that is not valid Unicode (never stored, schema or not)."""
    unreadable = text_problem(output)
    if unreadable is not None:
        parts, message = unreadable
        where = "/".join(map(str, parts)) or "(root)"
        raise StepError("invalid_output", f"output is not valid text: {where}: {message}")
    if not schema:
        return
    validator = _validator(json.dumps(schema, sort_keys=True))
    errors = sorted(validator.iter_errors(output), key=lambda e: list(e.absolute_path))
    if errors:
        detail = "; ".join(
            f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors[:10]
        )
        raise StepError("invalid_output", f"output does not match output_schema: {detail}")
