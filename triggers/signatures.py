"""Webhook signatures: the Standard Webhooks scheme (standardwebhooks.com), HMAC-SHA256.

A sender signs `"{webhook-id}.{webhook-timestamp}.{body}"` with the trigger's secret and sends
three headers:

    webhook-id:        the delivery id (the run's idempotency key: a redelivery starts nothing)
    webhook-timestamp: seconds since the epoch
    webhook-signature: "v1,<base64 of the HMAC-SHA256>" (several, space separated, while rotating)

The secret is `whsec_` + base64 of 32 random bytes; the HMAC key is those bytes. Signing the
id with the timestamp and the body means a captured request cannot be replayed under a new
delivery id, and the timestamp bounds how long it can be replayed at all (the trigger's
replay window). Libraries that speak the scheme (standardwebhooks, Svix) sign compatibly.

Pure apart from `secrets`: no database, no settings. It must never log or return a secret.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32
MAX_DELIVERY_ID = 128


class SignatureRefused(Exception):
    """The request is not signed by the trigger's secret, or not now. `reason` is a code:
    missing_headers, bad_timestamp, stale_timestamp, bad_signature, bad_delivery_id."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def secret_generate() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def _key(secret: str) -> bytes:
    raw = secret[len(SECRET_PREFIX):] if secret.startswith(SECRET_PREFIX) else secret
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a webhook secret is whsec_ followed by base64") from None


def fingerprint(secret: str) -> str:
    """A short identifier of the secret that reveals nothing usable about it."""
    return hashlib.sha256(_key(secret)).hexdigest()[:12]


def sign(secret: str, delivery_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header value for this delivery."""
    signed = f"{delivery_id}.{timestamp}.".encode() + body
    digest = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def delivery_id_problem(delivery_id: str) -> str | None:
    if not delivery_id:
        return "the webhook-id header is missing"
    if len(delivery_id) > MAX_DELIVERY_ID:
        return f"the webhook-id header is longer than {MAX_DELIVERY_ID} characters"
    if not delivery_id.isprintable() or not delivery_id.isascii():
        return "the webhook-id header must be printable ASCII"
    return None


def verify(*, secrets_: list[str], delivery_id: str, timestamp: str, signature: str, body: bytes,
           now_s: float, window_s: int) -> None:
    """Accept the delivery or raise SignatureRefused.

    `secrets_` are the secrets currently accepted (the new one, and the previous one during a
    rotation's grace period). The timestamp must be within `window_s` of `now_s`, either way.
    """
    if not (delivery_id and timestamp and signature):
        raise SignatureRefused("missing_headers", "the webhook-id, webhook-timestamp and "
                               "webhook-signature headers are required (Standard Webhooks)")
    problem = delivery_id_problem(delivery_id)
    if problem:
        raise SignatureRefused("bad_delivery_id", problem)
    if not timestamp.isdigit() or len(timestamp) > 12:
        raise SignatureRefused("bad_timestamp", "webhook-timestamp must be whole seconds since "
                               "the epoch")
    if abs(now_s - int(timestamp)) > window_s:
        raise SignatureRefused("stale_timestamp", f"webhook-timestamp is more than {window_s} s "
                               "from now: a replay, or the sender's clock is wrong")
    offered = [part.split(",", 1)[1] for part in signature.split()
               if part.startswith("v1,") and len(part) < 200]
    for secret in secrets_:
        expected = sign(secret, delivery_id, int(timestamp), body).split(",", 1)[1]
        if any(hmac.compare_digest(expected.encode(), candidate.encode()) for candidate in offered):
            return
    raise SignatureRefused("bad_signature", "the webhook-signature does not match the body "
                           "signed with this trigger's secret")
