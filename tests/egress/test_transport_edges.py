"""The guarded transport at its edges (from the mutation survivors of
orchestrator/integrations/egress/transport.py): what a refusal of a request or a redirect hop
says and names, how a name is looked up and connected to, and how the call's one deadline and
its connect timeout bound each phase. Real local servers, some of them silent or slow on
purpose; DNS is the one edge faked, by answering `socket.getaddrinfo` for test names."""

import ipaddress
import shutil
import socket
import ssl
import subprocess
import threading
import time

import httpcore
import httpx
import pytest

from orchestrator.integrations import egress
from orchestrator.integrations.egress import EgressRefused, Policy, transport
from tests.support.hostile_server import HostileServer

LOOPBACK = Policy(ports=None, allow_networks=(ipaddress.ip_network("127.0.0.0/8"),))


@pytest.fixture
def server():
    with HostileServer() as running:
        yield running


class Resolver:
    """What `socket.getaddrinfo` answers for test names: `answers[name]`, a list of answers
    given in turn (the last one repeats), each a list of addresses (a scope kept as `%zone`);
    `errors[name]`, raised; `delays[name]`, seconds slept first. `asked` lists the lookups of
    these names, in order; other hosts get the system's answer."""

    def __init__(self, real):
        self.real, self.asked = real, []
        self.answers, self.errors, self.delays = {}, {}, {}

    def __call__(self, host, port, *args, **kwargs):
        if host not in {*self.answers, *self.errors, *self.delays}:
            return self.real(host, port, *args, **kwargs)
        self.asked.append(host)
        time.sleep(self.delays.get(host, 0))
        if host in self.errors:
            raise self.errors[host]
        replies = self.answers[host]
        answer = replies.pop(0) if len(replies) > 1 else replies[0]
        return [
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", (a, port, 0, 0))
            if ":" in a
            else (socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
            for a in answer
        ]


@pytest.fixture
def resolver(monkeypatch):
    fake = Resolver(socket.getaddrinfo)
    monkeypatch.setattr(socket, "getaddrinfo", fake)
    return fake


@pytest.fixture
def silent_port():
    """A port whose listener never accepts and whose queue is full: a connect to it hangs."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    queued = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        try:
            filler.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        queued.append(filler)
    time.sleep(0.1)
    yield port
    for sock in [*queued, listener]:
        sock.close()


def call(url: str, **kwargs):
    return egress.request(
        "GET", url, policy=egress.policy_for(tool="http.request"), deadline_s=5, **kwargs
    )


@pytest.mark.parametrize(
    "url, shown, reason",
    [
        (
            "http://10.0.0.1:6379/keys?token=secret#top",
            "http://10.0.0.1:6379/keys",
            "10.0.0.1 is a private address",
        ),
        ("http://2130706433:6379/", "http://2130706433:6379/", "127.0.0.1 is a loopback address"),
        # RFC 6761: a name under .localhost is loopback, whatever a resolver would answer.
        (
            "http://svc.localhost:6379/",
            "http://svc.localhost:6379/",
            "127.0.0.1 is a loopback address",
        ),
    ],
)
def test_an_address_literal_is_refused_for_its_range_under_the_url_without_query_or_fragment(
    settings, resolver, url, shown, reason
):
    """The range is the refusal even where the port is refused too, and it is decided from the
    URL's text: the name is never looked up."""
    settings.STEPWISE_EGRESS = {}
    resolver.answers["svc.localhost"] = [["93.184.216.34"]]
    with pytest.raises(EgressRefused) as refused:
        call(url)
    assert str(refused.value) == (
        f"egress policy refuses {shown}: {reason}, refused unless an operator allows it"
    )
    assert refused.value.url == shown
    assert resolver.asked == []


def test_a_redirect_hop_to_an_address_literal_is_refused_under_the_hops_own_url(settings, server):
    settings.STEPWISE_EGRESS = {
        "default": {"ports": [80, server.port], "allow_networks": ["127.0.0.1/32"]}
    }
    with pytest.raises(EgressRefused) as refused:
        call(
            f"{server.url}/redirect-307?to=http://10.0.0.1:6379/next%3Fk%3Dv", follow_redirects=True
        )
    assert str(refused.value) == (
        "egress policy refuses http://10.0.0.1:6379/next: 10.0.0.1 is a private address, "
        "refused unless an operator allows it"
    )
    assert [r["path"] for r in server.requests] == ["/redirect-307"]


def test_each_redirect_hop_is_looked_up_and_checked_again_on_a_connection_of_its_own(
    server, resolver
):
    """No connection is kept for the next hop: a name that answers the hop's lookup with the
    metadata address is refused there, although its first answer was allowed."""
    first = f"http://hop.example:{server.port}"
    resolver.answers["hop.example"] = [["127.0.0.1"]]
    response = egress.request(
        "GET",
        f"{first}/redirect?to={first}/ok",
        policy=LOOPBACK,
        deadline_s=5,
        follow_redirects=True,
    )
    assert response.status_code == 200 and resolver.asked == ["hop.example", "hop.example"]
    resolver.answers["hop.example"] = [["127.0.0.1"], ["169.254.169.254"]]
    with pytest.raises(EgressRefused, match="resolves to 169.254.169.254; .*metadata"):
        egress.request(
            "GET",
            f"{first}/redirect?to={first}/ok",
            policy=LOOPBACK,
            deadline_s=5,
            follow_redirects=True,
        )
    assert [r["path"] for r in server.requests] == ["/redirect", "/ok", "/redirect"]


def test_a_names_next_address_is_tried_when_one_refuses_the_connection(resolver):
    """127.0.0.1 refuses (nothing listens there on the port); 127.0.0.2 answers."""
    with HostileServer(host="127.0.0.2") as elsewhere:
        resolver.answers["two.example"] = [["127.0.0.1", "127.0.0.2"]]
        response = egress.request(
            "GET", f"http://two.example:{elsewhere.port}/ok", policy=LOOPBACK, deadline_s=5
        )
        assert response.status_code == 200 and len(elsewhere.requests) == 1


def test_when_every_address_refuses_the_connection_the_systems_reason_is_raised(resolver):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]  # bound, never listening: connections are refused
    resolver.answers["down.example"] = [["127.0.0.1"]]
    with pytest.raises(httpx.ConnectError, match="Connection refused"):
        egress.request("GET", f"http://down.example:{port}/", policy=LOOPBACK, deadline_s=5)
    closed.close()


def test_a_name_that_does_not_resolve_is_a_connect_error_with_the_resolvers_reason(resolver):
    resolver.errors["nowhere.example"] = socket.gaierror(-2, "Name or service not known")
    with pytest.raises(httpx.ConnectError) as failed:
        egress.request("GET", "http://nowhere.example/", policy=LOOPBACK, deadline_s=5)
    assert str(failed.value) == (
        "could not resolve nowhere.example: [Errno -2] Name or service not known"
    )


def test_an_address_with_a_zone_is_judged_and_named_without_it(resolver):
    resolver.answers["zoned.example"] = [["fe80::1%eth0"]]
    with pytest.raises(EgressRefused) as refused:
        egress.request("GET", "http://zoned.example/", policy=LOOPBACK, deadline_s=5)
    assert refused.value.reason == (
        "it resolves to fe80::1; fe80::1 is a link-local address, refused unless an operator "
        "allows it"
    )


def test_a_hanging_lookup_ends_at_the_connect_timeout_and_holds_no_process_open(resolver):
    """The system resolver has no timeout: the lookup thread is left behind, as a daemon."""
    resolver.delays["slow.example"] = 3
    resolver.answers["slow.example"] = [["127.0.0.1"]]
    before = {t for t in threading.enumerate() if not t.daemon}
    started = time.monotonic()
    with pytest.raises(httpx.ConnectTimeout, match="resolving slow.example took longer than 0.3 s"):
        egress.request(
            "GET", "http://slow.example/", policy=LOOPBACK, deadline_s=4, connect_timeout_s=0.3
        )
    assert time.monotonic() - started < 1.5
    assert {t for t in threading.enumerate() if not t.daemon} == before


def test_a_connect_that_hangs_ends_at_the_connect_timeout_not_the_deadline(silent_port):
    started = time.monotonic()
    with pytest.raises(httpx.ConnectTimeout):
        egress.request(
            "GET",
            f"http://127.0.0.1:{silent_port}/",
            policy=LOOPBACK,
            deadline_s=4,
            connect_timeout_s=0.3,
        )
    assert time.monotonic() - started < 1.5


def test_a_deadline_already_over_before_connecting_is_a_connect_timeout_that_says_so(server):
    with pytest.raises(httpx.ConnectTimeout, match="^the call's deadline of 1e-06 s passed$"):
        egress.request("GET", f"{server.url}/ok", policy=LOOPBACK, deadline_s=1e-6)
    assert server.requests == []


def test_a_deadline_under_a_second_is_enough_for_a_prompt_server(server):
    # Just under a second: a loaded test machine has left the server's thread waiting half of one.
    response = egress.request("GET", f"{server.url}/ok", policy=LOOPBACK, deadline_s=0.95)
    assert response.status_code == 200


@pytest.fixture
def unread_port():
    """A server that accepts connections and never reads from them nor answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted = []

    def accept():
        while True:
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield listener.getsockname()[1]
    listener.close()
    for conn in accepted:
        conn.close()


def test_sending_a_body_nobody_reads_ends_at_the_deadline_and_says_so(unread_port):
    started = time.monotonic()
    with pytest.raises(httpx.WriteTimeout, match="the call's deadline of 1 s passed"):
        egress.request(
            "POST",
            f"http://127.0.0.1:{unread_port}/",
            policy=LOOPBACK,
            deadline_s=1,
            content=b"x" * (64 * 1024 * 1024),
        )
    assert time.monotonic() - started < 3


def test_a_server_that_reads_slowly_cannot_stretch_sending_past_the_deadline():
    """Each send that moves a few bytes must not restart the clock: the body is sent within
    what is left of the deadline, however the server paces its reading."""
    listener = socket.create_server(("127.0.0.1", 0))

    def read_slowly():
        conn, _ = listener.accept()
        with conn:
            while conn.recv(256 * 1024):
                time.sleep(0.05)

    threading.Thread(target=read_slowly, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(httpx.WriteTimeout, match="the call's deadline of 1 s passed"):
        egress.request(
            "POST",
            f"http://127.0.0.1:{listener.getsockname()[1]}/",
            policy=LOOPBACK,
            deadline_s=1,
            content=b"x" * (64 * 1024 * 1024),
        )
    assert time.monotonic() - started < 3
    listener.close()


def test_a_tls_handshake_nobody_answers_ends_at_the_connect_timeout(unread_port):
    started = time.monotonic()
    with pytest.raises(httpx.ConnectTimeout):
        egress.request(
            "GET",
            f"https://127.0.0.1:{unread_port}/",
            policy=LOOPBACK,
            deadline_s=4,
            connect_timeout_s=0.3,
        )
    assert time.monotonic() - started < 1.5


@pytest.fixture
def certificate(tmp_path):
    """A self-signed certificate for `tls.example`: (certificate file, key file)."""
    if not shutil.which("openssl"):
        pytest.skip("needs the openssl command")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=tls.example",
            "-addext",
            "subjectAltName=DNS:tls.example",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def tls_server(cert, key, then):
    """A TLS server for one connection, which calls `then(connection)` after the handshake;
    returns its port."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = listener.accept()
        listener.close()
        try:
            with context.wrap_socket(conn, server_side=True) as tls:
                then(tls)
        except (ssl.SSLError, OSError):
            pass  # a client that refuses the certificate hangs up

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1]


def test_a_certificate_authority_from_ssl_cert_file_is_not_trusted(
    certificate, resolver, monkeypatch
):
    """As proxies from the environment are not: the trusted authorities are the bundle's."""
    cert, key = certificate
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    port = tls_server(cert, key, lambda tls: tls.recv(1024))
    resolver.answers["tls.example"] = [["127.0.0.1"]]
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        egress.request("GET", f"https://tls.example:{port}/", policy=LOOPBACK, deadline_s=5)


def test_reads_over_tls_end_at_the_deadline_too(certificate):
    """The stream a TLS handshake returns keeps the deadline: a server that trickles its
    answer after the handshake is cut off when the deadline passes. Every phase here is given
    no timeout of its own, so each takes what is left of the deadline."""
    cert, key = certificate

    def trickle(tls):
        tls.recv(1024)
        for _ in range(40):
            tls.sendall(b"H")
            time.sleep(0.1)

    port = tls_server(cert, key, trickle)
    trusting = ssl.create_default_context(cafile=str(cert))
    backend = transport.GuardedBackend(LOOPBACK, transport.Deadline(1))
    stream = backend.connect_tcp("127.0.0.1", port)
    tls = stream.start_tls(trusting, server_hostname="tls.example")
    assert tls.get_extra_info("ssl_object").server_hostname == "tls.example"
    tls.write(b"GET / HTTP/1.1\r\nHost: tls.example\r\n\r\n")
    started = time.monotonic()
    with pytest.raises(httpcore.ReadTimeout, match="the call's deadline of 1 s passed"):
        while tls.read(1024):
            pass
    assert time.monotonic() - started < 1.5
    tls.close()


def test_a_phase_begun_after_the_deadline_fails_at_once_in_the_deadlines_words(certificate):
    cert, key = certificate
    port, other = (tls_server(cert, key, lambda tls: time.sleep(2)) for _ in range(2))
    trusting = ssl.create_default_context(cafile=str(cert))
    backend = transport.GuardedBackend(LOOPBACK, transport.Deadline(0.5))
    tls = backend.connect_tcp("127.0.0.1", port).start_tls(trusting, server_hostname="tls.example")
    plain = transport.GuardedBackend(LOOPBACK, transport.Deadline(0.5)).connect_tcp(
        "127.0.0.1", other
    )
    time.sleep(0.6)
    passed = "^the call's deadline of 0.5 s passed$"
    with pytest.raises(httpcore.WriteTimeout, match=passed):
        tls.write(b"GET / HTTP/1.1\r\n\r\n", timeout=5)
    with pytest.raises(httpcore.ReadTimeout, match=passed):
        tls.read(1024, timeout=5)
    with pytest.raises(httpcore.ConnectTimeout, match=passed):
        plain.start_tls(trusting, server_hostname="tls.example", timeout=5)
    tls.close()
    plain.close()
