"""Attestation: the signed record of who produced a step's output, and from what.

Every process that completes a step (a worker, the web server, beat, the reaper) has its own
Ed25519 key (`process_key`): provisioned from STEPWISE_ATTESTATION_KEY_FILE (a PEM file) or
STEPWISE_ATTESTATION_KEY (base64 of the raw 32-byte private key), else generated as the process
starts; its public half is registered in `WorkerKey` (services/attestations.py). As a step
completes, the process that completes it signs a record (`attestation_sign`): the step, the
attempt and its fencing token, the hashes of the rendered input, of the definition's step, of
each external call's request and response, the provider route and the output's hash. The
scheduler reads an output only when its record verifies against a registered, unrevoked key and
the output still has the hash the record names (`attestation_problem`).

A key id is "ed25519:" + the first 16 hex digits of SHA-256 over the raw public key (the form
`audit.signing` uses for the ledger's checkpoints). This module reads keys and checks records; it
writes no row: registering and revoking a key are services.
"""
from __future__ import annotations

import base64
import binascii
import copy
import hashlib
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from orchestrator.models import WorkerKey

from .hashing import canonical_json, digest_of, sha256_hex

#: The record's format; a verifier refuses any other.
VERSION = 1


@dataclass(frozen=True)
class ProcessKey:
    private: Ed25519PrivateKey
    key_id: str
    public_text: str
    # Where it came from: "file", "env" or "generated".
    source: str


def _public_raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id_of(key: Ed25519PublicKey) -> str:
    return f"ed25519:{hashlib.sha256(_public_raw(key)).hexdigest()[:16]}"


def public_text_of(key: Ed25519PublicKey) -> str:
    return base64.b64encode(_public_raw(key)).decode("ascii")


def public_key_of(text: str) -> Ed25519PublicKey:
    """Parse a registered public key (base64 of the raw 32 bytes). Raises ValueError."""
    try:
        return Ed25519PublicKey.from_public_bytes(base64.b64decode(text.strip(), validate=True))
    except binascii.Error as exc:
        raise ValueError(f"{text!r} is not base64") from exc


def _load_private() -> tuple[Ed25519PrivateKey, str]:
    path = getattr(settings, "STEPWISE_ATTESTATION_KEY_FILE", "") or ""
    raw = getattr(settings, "STEPWISE_ATTESTATION_KEY", "") or ""
    if path:
        try:
            key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
        except (OSError, ValueError, TypeError) as exc:
            raise ImproperlyConfigured(
                f"STEPWISE_ATTESTATION_KEY_FILE {path} is not a readable PEM private key: {exc}") from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise ImproperlyConfigured(f"STEPWISE_ATTESTATION_KEY_FILE {path} is not an Ed25519 key")
        return key, "file"
    if raw:
        try:
            return Ed25519PrivateKey.from_private_bytes(base64.b64decode(raw, validate=True)), "env"
        except (binascii.Error, ValueError) as exc:
            raise ImproperlyConfigured(
                "STEPWISE_ATTESTATION_KEY is not base64 of a raw 32-byte Ed25519 private key") from exc
    return Ed25519PrivateKey.generate(), "generated"


_process_key: tuple[int, ProcessKey] | None = None
_lock = threading.Lock()


def process_key() -> ProcessKey:
    """This process's signing key: provisioned, or generated once per process (a forked child
    generates its own, so no two worker processes share a generated key)."""
    global _process_key
    held = _process_key
    if held is not None and held[0] == os.getpid():
        return held[1]
    with _lock:
        if _process_key is None or _process_key[0] != os.getpid():
            private, source = _load_private()
            public = private.public_key()
            _process_key = (os.getpid(), ProcessKey(private, key_id_of(public),
                                                    public_text_of(public), source))
        return _process_key[1]


def process_label() -> str:
    """How a process names itself when it registers its key."""
    return f"{socket.gethostname()}:{os.getpid()}"


def output_digest(output: object) -> str:
    """The hash an output is attested by: of its canonical JSON as the database gives it back."""
    return digest_of(output)


def request_digest(value: object) -> str:
    try:
        return digest_of(value)
    except (TypeError, ValueError):
        return sha256_hex(repr(value))


def attestation_sign(record: dict, *, key: ProcessKey | None = None) -> dict:
    """The stored attestation of `record` (its fields, JSON): the record, the key id and the
    Ed25519 signature over the record's canonical JSON."""
    key = key or process_key()
    body = {"v": VERSION, **record}
    signature = base64.b64encode(key.private.sign(canonical_json(body).encode("ascii"))).decode("ascii")
    # What this process signed holds by construction: its own reads of it skip the verify.
    _remember(key.key_id, signature, body)
    return {"record": body, "key": key.key_id, "sig": signature}


def attestation_digest(attestation: dict | None) -> str:
    """What the ledger chains of an attestation (its step's completion entry carries it)."""
    return digest_of(attestation) if attestation else ""


# --- checking --------------------------------------------------------------------------------


@dataclass(frozen=True)
class KnownKey:
    public: Ed25519PublicKey
    process: str
    revoked: bool


# key id -> (read at, KnownKey or None): a key's registration is read once per
# STEPWISE_ATTESTATION_KEY_CACHE_S per process, so a revocation holds within that time.
_keys: dict[str, tuple[float, KnownKey | None]] = {}
# (key id, signature) -> the record this process verified (or signed) with it: a record is
# checked against its key once, its output's hash at every read.
_verified: dict[tuple[str, str], dict] = {}
_VERIFIED_MAX = 20_000


def _remember(key_id: str, signature: str, record: dict) -> None:
    if len(_verified) >= _VERIFIED_MAX:
        _verified.clear()
    # A copy (its values are strings, numbers and the list of calls, each with the routes it
    # tried), so a change made in place to the record later is not a change to what was verified.
    _verified[(key_id, signature)] = {**record, "calls": copy.deepcopy(record.get("calls") or [])}


def known_key(key_id: str) -> KnownKey | None:
    """The registered key `key_id` (None: never registered)."""
    ttl = getattr(settings, "STEPWISE_ATTESTATION_KEY_CACHE_S", 5.0)
    held = _keys.get(key_id)
    at = time.monotonic()
    if held is not None and at - held[0] < ttl:
        return held[1]
    row = WorkerKey.objects.filter(key_id=key_id).values_list(
        "public_key", "process", "revoked_at").first()
    known = None
    if row is not None:
        try:
            known = KnownKey(public_key_of(row[0]), row[1], row[2] is not None)
        except ValueError:
            known = None
    _keys[key_id] = (at, known)
    return known


def keys_forget() -> None:
    """Drop what this process remembers of keys and verified records (a key was revoked here)."""
    _keys.clear()
    _verified.clear()


def attestation_problem(*, step_id: int, output: object, attestation: dict | None,
                        item: int | None = None) -> str | None:
    """Why `output` of step `step_id` (of its map item `item`) may not be read, or None when its
    record holds: present, of this step (and item), signed by a registered and unrevoked key,
    and naming this output's hash."""
    if not attestation:
        return "no attestation: nothing records who produced this output"
    try:
        record, key_id, signature = attestation["record"], attestation["key"], attestation["sig"]
    except (KeyError, TypeError):
        return "malformed attestation"
    if not isinstance(record, dict) or record.get("v") != VERSION:
        return "malformed attestation"
    if record.get("step") != step_id:
        return f"the attestation is of step {record.get('step')}, not of this step"
    if record.get("item") != item:
        return f"the attestation is of item {record.get('item')}, not of this one"
    known = known_key(key_id)
    if known is None:
        return f"signed by key {key_id}, which is not registered"
    if known.revoked:
        return f"signed by key {key_id}, which is revoked"
    # The record itself is part of what is remembered: an altered record with a signature seen
    # before is verified, and refused, like any other.
    if _verified.get((key_id, signature)) != record:
        try:
            known.public.verify(base64.b64decode(signature, validate=True),
                                canonical_json(record).encode("ascii"))
        except (InvalidSignature, binascii.Error, ValueError):
            return "the signature does not verify: the record was altered"
        _remember(key_id, signature, record)
    try:
        digest = output_digest(output)
    except (TypeError, ValueError):
        return "the output is not JSON"
    if digest != record.get("output"):
        return "the output does not match its attestation: it changed after it was produced"
    return None


def producer_of(attestation: dict | None) -> tuple[str, str]:
    """(who produced it, key id) as a record names them, ("", "") without one."""
    if not attestation:
        return "", ""
    record = attestation.get("record") or {}
    return str(record.get("producer", "")), str(attestation.get("key", ""))
