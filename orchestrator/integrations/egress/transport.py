"""The guarded transport: httpx connects only to addresses the policy allows, within a deadline.

Owns how a connection is made, not whether a URL is acceptable (`policy.py` decides both).
`GuardedTransport` checks each request's scheme, host and port (and a host written as an
address, in any spelling) before it is sent — every redirect hop is a request of its own, so
each is checked — and opens connections through
`GuardedBackend`, an httpcore network backend that:

1. resolves the host once (an address literal in any spelling resolves to itself);
2. checks every address the name resolved to, and refuses the call if any is refused — a
   name that answers with a public and a private address is not trusted with either;
3. connects to a checked address itself, never to the name, so a second lookup cannot
   answer differently (DNS rebinding); httpcore still sends the URL's host as the Host header
   and as the TLS server name, so virtual hosting and certificate checks are unchanged;
4. bounds every phase by one deadline for the whole call — the lookup, connect, TLS handshake
   and each read and write take at most what is left of it, so a server that trickles a byte a
   second is cut off when the deadline passes, not after one idle timeout per byte.

Proxies from the environment are ignored (`trust_env=False`): through a proxy the address
connected to would be the proxy's, and the policy could not see the destination.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Iterable
from functools import lru_cache

import httpcore
import httpx

from .errors import EgressRefused
from .policy import IPAddress, Policy, address_refusal, literal_address, origin_refusal


class Deadline:
    """The monotonic instant a call must be over by; `left(phase)` is what each phase may take."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def left(self, timeout: float | None, expired: type[Exception]) -> float:
        """min(`timeout`, time left); raises `expired` once the deadline has passed."""
        remaining = self.at - time.monotonic()
        if remaining <= 0:
            raise expired(f"the call's deadline of {self.seconds:g} s passed")
        return remaining if timeout is None else min(timeout, remaining)

    def check(self, expired: type[Exception]) -> None:
        """Raise `expired`, saying so, if a timeout that just fired was the deadline's."""
        if self.at - time.monotonic() < 0.05:
            raise expired(f"the call's deadline of {self.seconds:g} s passed")


class GuardedBackend(httpcore.NetworkBackend):
    def __init__(self, policy: Policy, deadline: Deadline):
        self.policy = policy
        self.deadline = deadline
        self._inner = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: Iterable | None = None) -> httpcore.NetworkStream:
        addresses = resolve(host, port, self._time_to_connect(timeout))
        for address in addresses:
            reason = address_refusal(address, host=host, policy=self.policy)
            if reason:
                if str(address) != host:
                    reason = f"it resolves to {display(address)}; {reason}"
                raise EgressRefused(f"{host}:{port}", reason)
        error: Exception | None = None
        for address in addresses:
            try:
                stream = self._inner.connect_tcp(
                    str(address), port, timeout=self._time_to_connect(timeout),
                    local_address=local_address, socket_options=socket_options)
            except httpcore.ConnectError as exc:  # try the next checked address
                error = exc
                continue
            return DeadlineStream(stream, self.deadline)
        raise error or httpcore.ConnectError(f"could not connect to {host}:{port}")

    def _time_to_connect(self, timeout: float | None) -> float:
        """What the lookup, and then each address's connect, may take: a deadline passed
        before or between them is a ConnectTimeout."""
        return self.deadline.left(timeout, httpcore.ConnectTimeout)

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable | None = None) -> httpcore.NetworkStream:
        raise EgressRefused(path, "connections to Unix sockets are not allowed")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


#: The most one write to the socket is given at once (see `DeadlineStream.write`).
WRITE_PIECE = 64 * 1024


class DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read, write and handshake ends by the call's deadline."""

    def __init__(self, stream: httpcore.NetworkStream, deadline: Deadline):
        self._stream = stream
        self._deadline = deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            return self._stream.read(max_bytes, self._deadline.left(timeout, httpcore.ReadTimeout))
        except httpcore.ReadTimeout:
            self._deadline.check(httpcore.ReadTimeout)
            raise

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        try:
            # httpcore gives its timeout to each send of one write, so a server that reads a
            # little at a time would keep a large write going past the deadline: the buffer is
            # handed over in pieces, each with what is left.
            for start in range(0, len(buffer), WRITE_PIECE):
                self._stream.write(buffer[start:start + WRITE_PIECE],
                                   self._deadline.left(timeout, httpcore.WriteTimeout))
        except httpcore.WriteTimeout:
            self._deadline.check(httpcore.WriteTimeout)
            raise

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        stream = self._stream.start_tls(ssl_context, server_hostname,
                                        self._deadline.left(timeout, httpcore.ConnectTimeout))
        return DeadlineStream(stream, self._deadline)

    def get_extra_info(self, info: str):
        return self._stream.get_extra_info(info)


class GuardedTransport(httpx.HTTPTransport):
    """httpx's own transport, with every request checked and every connection guarded."""

    def __init__(self, policy: Policy, deadline: Deadline):
        context = _ssl_context()
        super().__init__(verify=context, trust_env=False, retries=0)
        # httpx builds its connection pool with httpcore's default network backend and offers
        # no parameter for another; the pool it keeps in `_pool` is replaced by the same pool
        # with the guarded backend. If httpx ever renames it, fail loudly rather than send
        # unguarded requests.
        if not isinstance(getattr(self, "_pool", None), httpcore.ConnectionPool):
            raise RuntimeError("httpx.HTTPTransport has no connection pool to guard")
        self._pool = httpcore.ConnectionPool(
            ssl_context=context, max_connections=10, max_keepalive_connections=0, retries=0,
            network_backend=GuardedBackend(policy, deadline))
        self.policy = policy

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        host = url.raw_host.decode("ascii")  # as resolved: an IDN in its xn-- form
        literal = literal_address(host)
        reason = address_refusal(literal, host=host, policy=self.policy) if literal else None
        reason = reason or origin_refusal(url.scheme, host, url.port, self.policy)
        if reason:
            raise EgressRefused(str(url.copy_with(query=None, fragment=None)), reason)
        return super().handle_request(request)


def resolve(host: str, port: int, timeout: float) -> list[IPAddress]:
    """The addresses `host` resolves to, in the resolver's order, without duplicates.

    The system resolver has no timeout of its own; it runs in a daemon thread so the call's
    deadline holds even when DNS hangs. Raises httpcore.ConnectError for a name that does not
    resolve (an unknown name is never treated as allowed) and httpcore.ConnectTimeout.
    """
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    answer: dict = {}
    done = threading.Event()

    def lookup() -> None:
        try:
            answer["infos"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            answer["error"] = exc
        finally:
            done.set()

    threading.Thread(target=lookup, name="egress-resolve", daemon=True).start()
    if not done.wait(timeout):
        raise httpcore.ConnectTimeout(f"resolving {host} took longer than {timeout:g} s")
    if "error" in answer:
        raise httpcore.ConnectError(f"could not resolve {host}: {answer['error']}")
    addresses: list[IPAddress] = []
    for family, _, _, _, sockaddr in answer["infos"]:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise httpcore.ConnectError(f"{host} resolved to no address")
    return addresses


def display(address: IPAddress) -> str:
    """An address as people write it (an IPv4-mapped one in its dotted form)."""
    mapped = getattr(address, "ipv4_mapped", None)
    return f"::ffff:{mapped}" if mapped is not None else str(address)


@lru_cache(maxsize=1)
def _ssl_context() -> ssl.SSLContext:
    # Loading the CA bundle takes tens of milliseconds; one context serves every connection.
    return httpx.create_ssl_context(trust_env=False)
