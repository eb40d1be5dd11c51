"""Webhook signatures (triggers/signatures.py): the Standard Webhooks scheme."""
import base64
import hashlib
import hmac
import shutil
import subprocess
import time

import pytest

from triggers.signatures import SignatureRefused, fingerprint, secret_generate, sign, verify

BODY = b'{"ticket_id": "T-2"}'
NOW = 1_800_000_000


def check(secret, *, delivery="d-1", timestamp=NOW, signature=None, body=BODY, now=NOW,
          window=300, accepted=None):
    signature = signature if signature is not None else sign(secret, delivery, timestamp, body)
    verify(secrets_=accepted or [secret], delivery_id=delivery, timestamp=str(timestamp),
           signature=signature, body=body, now_s=now, window_s=window)


def test_the_signature_is_hmac_sha256_of_id_timestamp_and_body_under_the_secret_bytes():
    secret = secret_generate()
    key = base64.b64decode(secret.removeprefix("whsec_"))
    expected = base64.b64encode(hmac.new(key, b"d-1.1800000000." + BODY, hashlib.sha256).digest())
    assert sign(secret, "d-1", NOW, BODY) == "v1," + expected.decode()
    check(secret)


@pytest.mark.parametrize("spoil, reason", [
    (dict(body=BODY + b" "), "bad_signature"),            # the body was changed
    (dict(delivery="d-2"), "bad_signature"),              # replayed under another delivery id
    (dict(now=NOW + 301), "stale_timestamp"),             # too old: a replay
    (dict(now=NOW - 301), "stale_timestamp"),             # from the future
    (dict(signature=""), "missing_headers"),
    (dict(signature="v1,AAAA"), "bad_signature"),
    (dict(signature="v2,whatever"), "bad_signature"),
    (dict(delivery="x" * 200), "bad_delivery_id"),
])
def test_a_changed_replayed_stale_or_unsigned_delivery_is_refused(spoil, reason):
    secret = secret_generate()
    good = sign(secret, "d-1", NOW, BODY)
    options = {"signature": good, **spoil}
    with pytest.raises(SignatureRefused) as refused:
        check(secret, **options)
    assert refused.value.reason == reason


def test_another_secret_does_not_verify_but_a_rotated_pair_does():
    old, new = secret_generate(), secret_generate()
    with pytest.raises(SignatureRefused):
        check(old, signature=sign(new, "d-1", NOW, BODY))
    check(new, signature=sign(old, "d-1", NOW, BODY), accepted=[new, old])
    # a sender may send both signatures while it switches
    check(new, signature=f"{sign(old, 'd-1', NOW, BODY)} {sign(new, 'd-1', NOW, BODY)}")


def test_a_fingerprint_identifies_a_secret_without_revealing_it():
    secret = secret_generate()
    assert fingerprint(secret) == fingerprint(secret) != fingerprint(secret_generate())
    assert fingerprint(secret) not in secret


@pytest.mark.skipif(not shutil.which("openssl"), reason="needs openssl")
def test_the_shell_recipe_in_the_readme_signs_what_the_server_verifies():
    secret = secret_generate()
    timestamp = int(time.time())
    script = ("KEY=$(printf %s \"${SECRET#whsec_}\" | base64 -d | od -An -tx1 | tr -d ' \\n'); "
              "printf '%s.%s.%s' \"$ID\" \"$TS\" \"$BODY\" | openssl dgst -sha256 -mac HMAC "
              "-macopt hexkey:$KEY -binary | base64")
    signed = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True, env={
        "SECRET": secret, "ID": "delivery-1", "TS": str(timestamp), "BODY": BODY.decode(),
        "PATH": "/usr/bin:/bin"}).stdout.strip()
    verify(secrets_=[secret], delivery_id="delivery-1", timestamp=str(timestamp),
           signature=f"v1,{signed}", body=BODY, now_s=time.time(), window_s=300)
