"""The one canonical JSON form and SHA-256 digest every hash in Stepwise is computed from.

Workflow digests, proposal hashes, prompt and schema hashes, approval bindings and the audit
ledger's chain all use `canonical_json`: sorted keys, no whitespace, ASCII only (so NUL and
odd characters are escaped and the text is the same on every platform), no NaN. The audit
chain's entries are hashed from this text, so it must never change. Pure: no Django, no I/O.
"""
import hashlib
import json


def canonical_json(value: object) -> str:
    """The canonical text of a JSON value. Raises ValueError for NaN/Infinity, TypeError for a
    value that is not JSON (dates and decimals are the caller's to convert)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def digest_of(value: object) -> str:
    """SHA-256 (hex) of the canonical JSON of `value`."""
    return sha256_hex(canonical_json(value))
