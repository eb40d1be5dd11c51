"""Secrets at rest: encrypted with a key the database does not hold.

The one way Stepwise encrypts what it must read back (webhook secrets, secret run inputs, runs'
callback signing secrets):
Fernet (AES-128-CBC + HMAC-SHA256, from `cryptography`) under a key derived with HKDF-SHA256
from STEPWISE_TRIGGER_KEY, a different derivation (`purpose`) for each kind of secret, so a
ciphertext of one kind never opens as another. Development generates that key once into
var/secrets/; production must set it (orchestrator/operations/deployment.py). Rotating it: put the
old value in STEPWISE_TRIGGER_KEY_FALLBACKS, set the new one, then `manage.py
stepwise_reseal_triggers` re-encrypts what is stored under the new key (docs/security.md).

Reads settings; never logs, returns or stores a secret in the clear.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


def _fernet(key: str, purpose: bytes) -> Fernet:
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=purpose).derive(key.encode())
    return Fernet(base64.urlsafe_b64encode(derived))


@dataclass(frozen=True)
class Sealer:
    """Seals one kind of secret; `what` names it in errors ("a webhook secret")."""

    purpose: bytes
    what: str

    def _box(self) -> MultiFernet:
        key = getattr(settings, "STEPWISE_TRIGGER_KEY", "")
        if not key:
            raise ImproperlyConfigured(f"STEPWISE_TRIGGER_KEY is not set: {self.what} cannot be "
                                       "kept (docs/security.md)")
        fallbacks = getattr(settings, "STEPWISE_TRIGGER_KEY_FALLBACKS", [])
        return MultiFernet([_fernet(key, self.purpose),
                            *(_fernet(old, self.purpose) for old in fallbacks)])

    def seal(self, secret: str) -> str:
        return self._box().encrypt(secret.encode()).decode("ascii")

    def unseal(self, ciphertext: str) -> str:
        """The secret. Raises ImproperlyConfigured when no configured key opens it."""
        try:
            return self._box().decrypt(ciphertext.encode("ascii")).decode()
        except InvalidToken:
            raise ImproperlyConfigured(f"{self.what} was sealed under a key that is neither "
                                       "STEPWISE_TRIGGER_KEY nor one of its fallbacks") from None

    def reseal(self, ciphertext: str) -> str:
        """The same secret sealed under the current key (after a key rotation)."""
        return self._box().rotate(ciphertext.encode("ascii")).decode("ascii")


WEBHOOK_SECRETS = Sealer(b"stepwise webhook secrets v1", "a webhook secret")
RUN_SECRETS = Sealer(b"stepwise run secrets v1", "a run's secret input")
CALLBACK_SECRETS = Sealer(b"stepwise callback secrets v1", "a run's callback secret")
