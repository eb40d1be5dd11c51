"""`request`: the one way Stepwise makes an outbound HTTP call.

Owns one call from start to a fully read body: a fresh guarded client (no connection shared
between calls, so no pooled connection outlives the policy it was checked under), redirects
(off unless the caller asks; then each hop is sent through the guarded transport, checked
again, and its body never read), the response size cap (a declared Content-Length over the cap
is refused unread; otherwise the read stops at the cap) and the deadline (transport.py). It
does not classify HTTP statuses: a 4xx/5xx is a response, for the caller to judge.
"""

from __future__ import annotations

import json as jsonlib
from dataclasses import dataclass

import httpx

from .errors import EgressRefused, ResponseTooLarge
from .policy import Policy
from .transport import Deadline, GuardedTransport

MAX_DEADLINE_S = 86400.0


@dataclass(frozen=True)
class EgressResponse:
    status_code: int
    headers: httpx.Headers
    content: bytes
    url: str

    @property
    def text(self) -> str:
        charset = httpx.Headers(self.headers).get_list("content-type")
        encoding = "utf-8"
        for value in charset:
            for part in value.split(";")[1:]:
                key, _, val = part.strip().partition("=")
                if key.lower() == "charset" and val:
                    encoding = val.strip('"')
        try:
            return self.content.decode(encoding, errors="replace")
        except LookupError:
            return self.content.decode("utf-8", errors="replace")

    def json(self) -> object:
        """The body as JSON. Raises ValueError when it is not."""
        return jsonlib.loads(self.content)


def request(method: str, url: str, *, policy: Policy, deadline_s: float,
            connect_timeout_s: float | None = None, headers: dict | None = None,
            params: dict | None = None, json: object = None, content: str | bytes | None = None,
            follow_redirects: bool = False) -> EgressResponse:
    """Send one request where `policy` allows, and read its response within `deadline_s`
    seconds in all (lookup, connect, TLS, sending, and every read of the body; at most a day).

    Raises EgressRefused (a destination the policy refuses, or too many redirects),
    ResponseTooLarge, and httpx's errors: TimeoutException subclasses once the deadline
    passes, TransportError for a failed connection, InvalidURL / UnsupportedProtocol.
    """
    # No call outlives a day, and a socket cannot wait much longer than that anyway.
    deadline_s = min(float(deadline_s), MAX_DEADLINE_S)
    deadline = Deadline(deadline_s)
    connect = min(connect_timeout_s or deadline_s, deadline_s)
    timeout = httpx.Timeout(deadline_s, connect=connect)
    transport = GuardedTransport(policy, deadline)
    with httpx.Client(transport=transport, timeout=timeout, trust_env=False,
                      follow_redirects=False) as client:
        outgoing = client.build_request(method, url, headers=headers, params=params, json=json,
                                        content=content)
        hops = 0
        while True:
            response = client.send(outgoing, stream=True, follow_redirects=False)
            try:
                if follow_redirects and response.next_request is not None:
                    if hops >= policy.max_redirects:
                        # Named as every refusal is: without a query that may hold a secret.
                        shown = str(outgoing.url.copy_with(query=None, fragment=None))
                        raise EgressRefused(shown, f"more than {policy.max_redirects} "
                                            "redirects (max_redirects)")
                    hops += 1
                    outgoing = response.next_request
                    continue
                body = _read_capped(response, policy.max_response_bytes)
                return EgressResponse(response.status_code, response.headers, body,
                                      str(response.url))
            finally:
                response.close()


def _read_capped(response: httpx.Response, limit: int) -> bytes:
    shown = str(response.url.copy_with(query=None, fragment=None))
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ResponseTooLarge(shown, limit, declared=int(declared))
    body = bytearray()
    # Decoded bytes are counted, so a compressed body cannot expand past the cap either.
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) > limit:
            raise ResponseTooLarge(shown, limit)
    return bytes(body)
