"""Webhook secrets at rest: encrypted with a key the database does not hold.

A webhook's secret has to be read back to check a signature, so it cannot be hashed; it is
sealed with Fernet (AES-128-CBC + HMAC-SHA256, from `cryptography`) under a key derived from
STEPWISE_TRIGGER_KEY. Development generates that key once into var/secrets/; production must
set it (orchestrator/deployment.py). Rotating it: put the old value in
STEPWISE_TRIGGER_KEY_FALLBACKS, set the new one, then `manage.py stepwise_reseal_triggers`
re-encrypts every secret under the new key (docs/security.md).

Reads settings; never logs, returns or stores a secret in the clear.
"""
from __future__ import annotations

import base64

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


def _fernet(key: str) -> Fernet:
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                   info=b"stepwise webhook secrets v1").derive(key.encode())
    return Fernet(base64.urlsafe_b64encode(derived))


def _box() -> MultiFernet:
    key = getattr(settings, "STEPWISE_TRIGGER_KEY", "")
    if not key:
        raise ImproperlyConfigured("STEPWISE_TRIGGER_KEY is not set: webhook secrets cannot be "
                                   "kept (docs/security.md)")
    fallbacks = getattr(settings, "STEPWISE_TRIGGER_KEY_FALLBACKS", [])
    return MultiFernet([_fernet(key), *(_fernet(old) for old in fallbacks)])


def seal(secret: str) -> str:
    return _box().encrypt(secret.encode()).decode("ascii")


def unseal(ciphertext: str) -> str:
    """The secret. Raises ImproperlyConfigured when no configured key opens it."""
    try:
        return _box().decrypt(ciphertext.encode("ascii")).decode()
    except InvalidToken:
        raise ImproperlyConfigured("a webhook secret was sealed under a key that is neither "
                                   "STEPWISE_TRIGGER_KEY nor one of its fallbacks") from None


def reseal(ciphertext: str) -> str:
    """The same secret sealed under the current key (after a key rotation)."""
    return _box().rotate(ciphertext.encode("ascii")).decode("ascii")
