"""Redaction: what of a run's data the ledger may hold.

Owns three rules, applied to everything `audit.services` records:

1. Secrets, always: a mapping key that names a secret (password, secret, token, api key,
   authorization, cookie, credential, private key, session id — as a word of the key, so
   `access_token` and `X-Api-Key` match and `tokens_in` does not) has its value replaced; so do
   bearer tokens and well-known key formats inside any string.
2. Sensitive paths, per workflow: `audit.sensitive` in the definition lists paths into the run's
   data namespace (`input.customer_email`, `steps.draft.output.reply`, `*` matches any one
   segment). A value found at such a path is replaced by a marker; the same value found inside
   any other string of an entry (a rendered prompt, tool params, an error message) is replaced
   by a short marker too, provided it is at least `MIN_SCRUB_LENGTH` characters long.
3. References, per workflow: with `audit.store_prompts: reference`, rendered prompts, tool
   params, run input and step outputs are not stored at all; the entry holds where they live
   and their keyed hash, so the data can be matched later without the ledger holding it.

A replaced value becomes {"redacted": "hmac-sha256:<hex>", "summary": "c***@example.com"}. The
hash is keyed (AUDIT_REDACTION_KEY, a secret of its own), so the same value gives
the same hash within an installation (entries can be correlated) but a guessable value (an
e-mail address) cannot be confirmed by hashing candidates without the key.

It must not write anything and must not decide what is recorded.
"""
from __future__ import annotations

import hashlib
import hmac
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from functools import cache, lru_cache
from uuid import UUID

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from orchestrator.engine.hashing import canonical_json

SECRET_WORDS = ("password", "passwd", "passphrase", "secret", "secrets", "token", "apikey",
                "authorization", "cookie", "cookies", "credential", "credentials", "privatekey",
                "sessionid")
SECRET_PATTERNS = [
    re.compile(r"(?i:\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,})"),
    re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"),
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
]
# Whether any of them is in a text: one scan, where most texts hold none.
_ANY_SECRET = re.compile("|".join(f"(?:{p.pattern})" for p in SECRET_PATTERNS))
# Shorter sensitive values are only redacted where they sit, not searched for inside text:
# replacing every "no" or "42" in a ledger would destroy it without protecting anyone.
MIN_SCRUB_LENGTH = 4
INLINE, REFERENCE = "inline", "reference"


@cache
def _redaction_key() -> bytes:
    """AUDIT_REDACTION_KEY: a secret of its own (docs/security.md), never derived from SECRET_KEY.

    Raises ImproperlyConfigured when it is not set (settings always set it in development).
    """
    key = getattr(settings, "AUDIT_REDACTION_KEY", "") or ""
    if not key:
        raise ImproperlyConfigured("AUDIT_REDACTION_KEY is not set: the ledger cannot redact")
    return key.encode()


def keyed_hash(value: object) -> str:
    """The keyed hash of a JSON value, as "hmac-sha256:<hex>"."""
    text = value if isinstance(value, str) else canonical_json(json_safe(value))
    return "hmac-sha256:" + hmac.new(_redaction_key(), text.encode(), hashlib.sha256).hexdigest()


def json_safe(value: object) -> object:
    """`value` as plain JSON data: decimals, times and ids become strings, NaN becomes text."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((json_safe(v) for v in value), key=str)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal | UUID):
        return str(value)
    return str(value)


def _words(key: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", key)
    return [w for w in re.split(r"[^a-z0-9]+", spaced.lower()) if w]


def is_secret_key(key: str) -> bool:
    """Whether a mapping key names a secret (by its words, and pairs of words: api_key)."""
    return _is_secret_word_key(str(key))


# Entries repeat the same few keys (attempt, queue, output...): each is split into words once
# per process, and the cache is bounded for the keys of arbitrary data.
@lru_cache(maxsize=4096)
def _is_secret_word_key(key: str) -> bool:
    words = _words(key)
    candidates = words + [a + b for a, b in zip(words, words[1:], strict=False)]
    return any(c.endswith(w) for c in candidates for w in SECRET_WORDS)


def summary_of(value: object, *, secret: bool = False) -> str:
    """A masked description that says what kind of value it was, never what it was."""
    if secret:
        return "***"
    if isinstance(value, str):
        if re.fullmatch(r"[^@\s]+@[^@\s]+", value):
            local, domain = value.split("@", 1)
            return f"{local[0]}***@{domain}"
        return f"{value[:1]}*** ({len(value)} chars)" if value else "(empty)"
    if isinstance(value, bool):
        return "<bool>"
    if isinstance(value, int | float | Decimal):
        return "<number>"
    if isinstance(value, dict):
        return f"<object, {len(value)} keys>"
    if isinstance(value, list | tuple):
        return f"<list, {len(value)} items>"
    return "<null>" if value is None else f"<{type(value).__name__}>"


def marker(value: object, *, secret: bool = False) -> dict:
    return {"redacted": keyed_hash(value), "summary": summary_of(value, secret=secret)}


def reference(location: str, value: object) -> dict:
    """Data kept out of the ledger: where it lives and the keyed hash that identifies it."""
    return {"ref": location, "hash": keyed_hash(value)}


# --- per-workflow policy --------------------------------------------------------------------

Path = tuple[str, ...]


@dataclass(frozen=True)
class Policy:
    """A workflow's `audit` section, parsed."""

    sensitive: tuple[Path, ...] = ()
    store_prompts: str = INLINE

    @classmethod
    def of(cls, definition: dict | None) -> Policy:
        section = (definition or {}).get("audit") or {}
        return cls(tuple(tuple(p.split(".")) for p in section.get("sensitive") or ()),
                   section.get("store_prompts") or INLINE)

    @property
    def by_reference(self) -> bool:
        return self.store_prompts == REFERENCE

    def step_names(self) -> set[str]:
        """Steps whose output holds a sensitive path."""
        return {p[1] for p in self.sensitive if len(p) > 1 and p[0] == "steps" and p[1] != "*"}

    def wants_all_steps(self) -> bool:
        return any(len(p) > 1 and p[0] == "steps" and p[1] == "*" for p in self.sensitive)

    def matches(self, path: Path) -> bool:
        return any(len(p) == len(path) and all(a in ("*", b) for a, b in zip(p, path, strict=True))
                   for p in self.sensitive)


def values_at(namespace: dict, pattern: Path) -> Iterator[object]:
    """Every value of `namespace` at `pattern` (`*` matches any key or index)."""
    nodes = [namespace]
    for segment in pattern:
        found = []
        for node in nodes:
            if isinstance(node, dict):
                found.extend(node.values() if segment == "*" else [node[segment]] if segment in node else [])
            elif isinstance(node, list):
                if segment == "*":
                    found.extend(node)
                elif segment.isdigit() and int(segment) < len(node):
                    found.append(node[int(segment)])
        nodes = found
    yield from nodes


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, int | float | Decimal) and not isinstance(value, bool):
        yield str(value)


class Redactor:
    """Applies the three rules for one run: its policy and the sensitive values it holds."""

    def __init__(self, policy: Policy, sensitive_values: Iterable[str] = ()):
        self.policy = policy
        values = {v for v in sensitive_values if len(v) >= MIN_SCRUB_LENGTH}
        # Longest first, so a value that contains another is replaced whole.
        self.values = sorted(values, key=len, reverse=True)

    @classmethod
    def for_namespace(cls, policy: Policy, namespace: dict) -> Redactor:
        """`namespace` is {"input": run input, "steps": {name: {"output": ...}}}."""
        found: list[str] = []
        for pattern in policy.sensitive:
            for value in values_at(namespace, pattern):
                found.extend(_strings(value))
        return cls(policy, found)

    def content(self, value: object, at: Path) -> object:
        """`value`, found at path `at` of the run's namespace, with all three rules applied."""
        return self._walk(json_safe(value), at)

    def scrub(self, value: object) -> object:
        """`value` (not in the namespace: params, messages) with secrets and known values hidden."""
        return self._walk(json_safe(value), None)

    def _walk(self, value: object, at: Path | None) -> object:
        if at is not None and self.policy.matches(at):
            return marker(value)
        if isinstance(value, dict):
            if set(value) == {"redacted", "summary"}:
                return value  # already a marker
            return {k: marker(v, secret=True) if is_secret_key(k)
                    else self._walk(v, None if at is None else (*at, k)) for k, v in value.items()}
        if isinstance(value, list):
            return [self._walk(v, None if at is None else (*at, str(i))) for i, v in enumerate(value)]
        if isinstance(value, str):
            return self.text(value)
        return value

    def text(self, text: str) -> str:
        if _ANY_SECRET.search(text):
            for pattern in SECRET_PATTERNS:
                text = pattern.sub("[secret]", text)
        for value in self.values:
            if value in text:
                text = text.replace(value, f"[redacted {keyed_hash(value)[:28]}]")
        return text
