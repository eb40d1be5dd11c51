"""The ledger's signing keys: Ed25519 key files, key ids, signatures and the trusted key set.

Checkpoints of the chain head (`audit.anchoring`) are signed with a private key the database
does not hold: a PEM file named by AUDIT_SIGNING_KEY_FILE (PKCS#8, as `openssl genpkey
-algorithm ed25519` writes it). Development generates it on first use under var/secrets/;
production names a file and never generates one. Verification trusts the signing key's own
public key and the public keys listed in AUDIT_VERIFY_KEYS (base64 of the raw 32 bytes), which
is how checkpoints signed before a key rotation stay verifiable (docs/security.md).

A key id is "ed25519:" + the first 16 hex digits of SHA-256 over the raw public key.

This module reads key files and signs bytes; it must not read the ledger or write checkpoints.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

ALGORITHM = "ed25519"


def public_key_text(key: Ed25519PublicKey) -> str:
    """The form AUDIT_VERIFY_KEYS takes: base64 of the raw 32-byte public key."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii")


def key_id(key: Ed25519PublicKey) -> str:
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return f"{ALGORITHM}:{hashlib.sha256(raw).hexdigest()[:16]}"


def private_key_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def signing_key_create(path: Path) -> Ed25519PrivateKey:
    """Write a new private key to `path` (mode 0600). Raises FileExistsError if one is there."""
    key = Ed25519PrivateKey.generate()
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(private_key_pem(key))
    return key


def signing_key() -> Ed25519PrivateKey:
    """The private key of AUDIT_SIGNING_KEY_FILE (created there first in development).

    Raises ImproperlyConfigured when the setting is empty, or the file is missing or is not
    an Ed25519 private key.
    """
    name = getattr(settings, "AUDIT_SIGNING_KEY_FILE", "") or ""
    if not name:
        raise ImproperlyConfigured(
            "AUDIT_SIGNING_KEY_FILE is not set: ledger checkpoints cannot be signed "
            "(create a key with `manage.py audit_keygen --output FILE`)")
    path = Path(name)
    if not path.exists() and not getattr(settings, "PRODUCTION", False):
        try:
            return signing_key_create(path)
        except FileExistsError:
            pass  # another process created it a moment ago
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except FileNotFoundError as exc:
        raise ImproperlyConfigured(f"AUDIT_SIGNING_KEY_FILE {path} does not exist") from exc
    except (ValueError, TypeError) as exc:
        raise ImproperlyConfigured(
            f"AUDIT_SIGNING_KEY_FILE {path} is not an unencrypted PEM private key: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise ImproperlyConfigured(f"AUDIT_SIGNING_KEY_FILE {path} is not an Ed25519 key")
    return key


def public_key_from_text(text: str) -> Ed25519PublicKey:
    """Parse one AUDIT_VERIFY_KEYS entry. Raises ImproperlyConfigured if it is not one."""
    try:
        return Ed25519PublicKey.from_public_bytes(base64.b64decode(text.strip(), validate=True))
    except (binascii.Error, ValueError) as exc:
        raise ImproperlyConfigured(
            f"AUDIT_VERIFY_KEYS entry {text!r} is not a base64 Ed25519 public key") from exc


def trusted_keys() -> dict[str, Ed25519PublicKey]:
    """key id -> public key: AUDIT_VERIFY_KEYS, and the signing key's own if one is configured."""
    keys = {}
    for text in getattr(settings, "AUDIT_VERIFY_KEYS", []) or []:
        key = public_key_from_text(text)
        keys[key_id(key)] = key
    if getattr(settings, "AUDIT_SIGNING_KEY_FILE", ""):
        try:
            own = signing_key().public_key()
        except ImproperlyConfigured:
            if not keys:
                raise
        else:
            keys[key_id(own)] = own
    return keys


def sign(message: bytes) -> tuple[str, str]:
    """(key id, base64 signature) of `message` with the signing key."""
    key = signing_key()
    return key_id(key.public_key()), base64.b64encode(key.sign(message)).decode("ascii")


def signature_valid(key: Ed25519PublicKey, message: bytes, signature: str) -> bool:
    try:
        key.verify(base64.b64decode(signature, validate=True), message)
    except (InvalidSignature, binascii.Error, ValueError):
        return False
    return True
