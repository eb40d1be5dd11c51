"""Webhook secrets at rest: encrypted with a key the database does not hold.

A webhook's secret has to be read back to check a signature, so it cannot be hashed; it is
sealed with `orchestrator.engine.sealing.WEBHOOK_SECRETS` (Fernet under a key derived from
STEPWISE_TRIGGER_KEY; the one encryption path of Stepwise). Rotating that key: put the old value
in STEPWISE_TRIGGER_KEY_FALLBACKS, set the new one, then `manage.py stepwise_reseal_triggers`
re-encrypts every secret under the new key (docs/security.md).

Reads settings; never logs, returns or stores a secret in the clear.
"""
from __future__ import annotations

from orchestrator.engine.sealing import WEBHOOK_SECRETS


def seal(secret: str) -> str:
    return WEBHOOK_SECRETS.seal(secret)


def unseal(ciphertext: str) -> str:
    """The secret. Raises ImproperlyConfigured when no configured key opens it."""
    return WEBHOOK_SECRETS.unseal(ciphertext)


def reseal(ciphertext: str) -> str:
    """The same secret sealed under the current key (after a key rotation)."""
    return WEBHOOK_SECRETS.reseal(ciphertext)
