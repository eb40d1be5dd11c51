"""The egress client against real local servers: what it refuses, where it connects, when it
stops reading. DNS is the one edge faked, by answering `socket.getaddrinfo` for test names."""
import ipaddress
import shutil
import socket
import ssl
import subprocess
import threading
import time

import httpx
import pytest

from orchestrator.integrations import egress
from orchestrator.integrations.egress import EgressRefused, Policy, ResponseTooLarge
from tests.support.hostile_server import HostileServer

ANY_PORT = {"default": {"ports": "*"}}  # the default policy, on the servers' random ports
LOOPBACK = {"default": {"ports": "*", "allow_networks": ["127.0.0.0/8"]}}
LOOPBACK_SPELLINGS = ["127.0.0.1", "localhost", "0.0.0.0", "2130706433", "0x7f000001", "127.1",
                      "[::ffff:127.0.0.1]"]


@pytest.fixture
def server():
    with HostileServer() as running:
        yield running


@pytest.fixture
def dns(monkeypatch):
    """Names the test makes resolve: `dns[name] = [answer, ...]`, each answer an address or a
    list of them, given in turn (the last one repeats); `dns.asked` counts lookups by name."""
    real = socket.getaddrinfo

    class Answers(dict):
        asked: dict

    answers = Answers()
    answers.asked = {}

    def getaddrinfo(host, port, *args, **kwargs):
        if host not in answers:
            return real(host, port, *args, **kwargs)
        answers.asked[host] = answers.asked.get(host, 0) + 1
        replies = answers[host]
        answer = replies.pop(0) if len(replies) > 1 else replies[0]
        infos = []
        for address in [answer] if isinstance(answer, str) else answer:
            if ":" in address:
                infos.append((socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0)))
            else:
                infos.append((socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port)))
        return infos

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return answers


def call(url: str, *, tool="http.request", **kwargs):
    return egress.request("GET", url, policy=egress.policy_for(tool=tool), deadline_s=5, **kwargs)


@pytest.mark.parametrize("host", LOOPBACK_SPELLINGS)
def test_every_spelling_of_loopback_is_refused_and_nothing_reaches_the_server(
        settings, server, host):
    settings.STEPWISE_EGRESS = ANY_PORT
    with pytest.raises(EgressRefused, match="loopback|unspecified"):
        call(f"http://{host}:{server.port}/ok")
    assert server.requests == []


@pytest.mark.parametrize("host", [h for h in LOOPBACK_SPELLINGS if h != "0.0.0.0"])
def test_loopback_allowed_explicitly_is_reached_by_every_spelling(settings, server, host):
    settings.STEPWISE_EGRESS = LOOPBACK
    response = call(f"http://{host}:{server.port}/ok")
    assert response.status_code == 200 and response.json() == {"ok": True}


def test_the_default_policy_refuses_loopback_on_any_port(settings, server):
    settings.STEPWISE_EGRESS = {}
    with pytest.raises(EgressRefused):
        call(f"http://127.0.0.1:{server.port}/ok")
    with pytest.raises(EgressRefused, match="loopback"):
        call("http://127.0.0.1/ok")
    assert server.requests == []


@pytest.mark.parametrize("url, reason", [
    ("http://169.254.169.254/latest/meta-data/", "cloud metadata"),
    ("http://[fd00:ec2::254]/latest/meta-data/", "cloud metadata"),
    ("http://10.0.0.1/", "private"), ("http://192.168.0.1/", "private"),
    ("http://172.16.5.4/", "private"), ("http://[fd12::1]/", "private"),
    ("http://100.64.0.1/", "carrier-grade"), ("http://[fe80::1]/", "link-local"),
    ("http://224.0.0.1/", "multicast"), ("http://[::1]/", "loopback"),
])
def test_internal_and_metadata_addresses_are_refused_before_connecting(settings, url, reason):
    settings.STEPWISE_EGRESS = {}
    with pytest.raises(EgressRefused, match=reason):  # refused by policy, never attempted
        call(url)


@pytest.mark.parametrize("address, reason", [
    ("127.0.0.1", "loopback"), ("169.254.169.254", "metadata"), ("10.1.2.3", "private"),
    ("::ffff:127.0.0.1", "loopback"),
])
def test_a_name_is_judged_by_the_address_it_resolves_to(settings, server, dns, address, reason):
    settings.STEPWISE_EGRESS = ANY_PORT
    dns["innocent.example"] = [address]
    with pytest.raises(EgressRefused, match=f"resolves to {address}; .*{reason}"):
        call(f"http://innocent.example:{server.port}/ok")
    assert server.requests == []


def test_a_name_with_one_refused_address_among_public_ones_is_refused(settings, dns):
    settings.STEPWISE_EGRESS = {}
    dns["mixed.example"] = [["93.184.216.34", "127.0.0.1"]]
    with pytest.raises(EgressRefused, match="127.0.0.1 is a loopback"):
        call("http://mixed.example/ok")


def test_the_name_is_resolved_once_and_the_checked_address_is_the_one_connected_to(
        settings, server, dns):
    """DNS rebinding: a second lookup would answer with loopback; there is none."""
    settings.STEPWISE_EGRESS = {"default": {"ports": "*", "allow_networks": ["127.0.0.1/32"]}}
    # The first answer is allowed; any later lookup would answer with the metadata address.
    dns["rebind.example"] = ["127.0.0.1", "169.254.169.254"]
    response = call(f"http://rebind.example:{server.port}/ok")
    assert response.status_code == 200
    assert dns.asked == {"rebind.example": 1}
    # Host is the URL's name, not the address connected to: virtual hosting still works.
    assert server.requests[0]["host"] == f"rebind.example:{server.port}"


def test_hosts_deny_hosts_ports_and_schemes_are_checked_before_any_lookup(settings, dns):
    settings.STEPWISE_EGRESS = {"default": {"hosts": ["*.example.com"],
                                            "deny_hosts": ["admin.example.com"]}}
    dns["api.example.com"] = ["93.184.216.34"]
    for url, reason in [("http://api.example.org/", "not in the allowed hosts"),
                        ("http://admin.example.com/", "deny_hosts"),
                        ("http://api.example.com:6379/", "port 6379"),
                        ("ftp://api.example.com/", "scheme")]:
        with pytest.raises((EgressRefused, httpx.UnsupportedProtocol), match=reason):
            call(url)
    assert dns.asked == {}


def test_redirects_are_not_followed_by_default(settings, server):
    settings.STEPWISE_EGRESS = LOOPBACK
    response = call(f"{server.url}/redirect?to=http://169.254.169.254/")
    assert response.status_code == 302
    assert response.headers["location"] == "http://169.254.169.254/"
    assert [r["path"] for r in server.requests] == ["/redirect"]


def test_each_redirect_hop_is_checked_again_when_following(settings, server):
    settings.STEPWISE_EGRESS = LOOPBACK
    followed = call(f"{server.url}/redirect?to={server.url}/ok", follow_redirects=True)
    assert followed.status_code == 200 and followed.json() == {"ok": True}
    for target, reason in [("http://169.254.169.254/latest/meta-data/", "metadata"),
                           ("http://10.0.0.1/", "private"),
                           ("gopher://127.0.0.1:6379/_INFO", "scheme")]:
        with pytest.raises((EgressRefused, httpx.UnsupportedProtocol), match=reason):
            call(f"{server.url}/redirect-307?to={target}", follow_redirects=True)


def test_a_redirect_loop_stops_at_max_redirects(settings, server):
    settings.STEPWISE_EGRESS = {"default": {**LOOPBACK["default"], "max_redirects": 2}}
    loop = f"{server.url}/redirect?to={server.url}/redirect%3Fto%3D{server.url}/ok"
    assert call(loop, follow_redirects=True).status_code == 200  # two hops: allowed
    with pytest.raises(EgressRefused, match="more than 2 redirects"):
        call(f"{server.url}/redirect?to={loop.replace('?', '%3F').replace('=', '%3D')}",
             follow_redirects=True)


def test_a_trickling_server_is_cut_off_at_the_deadline(settings, server):
    settings.STEPWISE_EGRESS = LOOPBACK
    # The trickle lasts 6 s; the error names the 1 s deadline that cut it off.
    with pytest.raises(httpx.TimeoutException, match="deadline of 1 s"):
        egress.request("GET", f"{server.url}/trickle?bytes=60&every=0.1",
                       policy=egress.policy_for(tool="http.request"), deadline_s=1)


@pytest.mark.parametrize("path", ["/big?mb=40", "/chunked?mb=40", "/gzip-bomb?mb=40"])
def test_a_response_over_the_cap_is_refused_and_its_read_stops(settings, server, path):
    settings.STEPWISE_EGRESS = LOOPBACK
    with pytest.raises(ResponseTooLarge, match="the limit is 1048576 bytes"):
        call(f"{server.url}{path}")
    if path.startswith("/chunked"):
        time.sleep(0.2)
        assert server.sent < 20 * 1024 * 1024  # the server could not push all 40 MiB


def test_a_response_within_the_cap_is_read_whole(settings, server):
    settings.STEPWISE_EGRESS = {"default": {**LOOPBACK["default"], "max_response_bytes": 2 * 1024 * 1024}}
    assert len(call(f"{server.url}/big?mb=2").content) == 2 * 1024 * 1024
    assert len(call(f"{server.url}/chunked?mb=1").content) == 1024 * 1024


def test_proxy_environment_variables_are_ignored(settings, server, monkeypatch):
    """Through a proxy the connected address would be the proxy's, not the destination's."""
    settings.STEPWISE_EGRESS = ANY_PORT
    monkeypatch.setenv("HTTP_PROXY", server.url)
    monkeypatch.setenv("ALL_PROXY", server.url)
    with pytest.raises(EgressRefused):
        call("http://10.0.0.1/")
    assert server.requests == []


def test_a_policy_can_be_passed_directly_for_a_webhook_sender(server):
    policy = Policy(ports=None, allow_networks=(ipaddress.ip_network("127.0.0.1/32"),))
    response = egress.request("POST", f"{server.url}/ok", policy=policy, deadline_s=2,
                              json={"event": "run.completed"})
    assert response.status_code == 200


def test_an_absurd_deadline_is_capped_not_an_overflow(settings, server):
    settings.STEPWISE_EGRESS = LOOPBACK
    response = egress.request("GET", f"{server.url}/ok", policy=egress.policy_for(tool="x"),
                              deadline_s=1e30)
    assert response.status_code == 200


@pytest.mark.skipif(not shutil.which("openssl"), reason="needs the openssl command")
def test_tls_names_the_host_not_the_address_connected_to(settings, dns, tmp_path):
    """The server name (SNI) and the certificate check are the URL's host's, although the
    connection goes to the checked address."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=tls.example", "-addext", "subjectAltName=DNS:tls.example",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    names = []
    context.sni_callback = lambda sock, name, ctx: names.append(name)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve():
        conn, _ = listener.accept()
        try:
            context.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError):
            pass  # the client refuses our self-signed certificate, as it should
        finally:
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    settings.STEPWISE_EGRESS = LOOPBACK
    dns["tls.example"] = ["127.0.0.1"]
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        call(f"https://tls.example:{port}/")
    listener.close()
    assert names == ["tls.example"]


def test_the_connection_goes_to_the_checked_address_and_a_refusal_names_host_and_port(
        settings, dns):
    """Not to the name, nor to whatever the system would pick: a server listening only on
    127.0.0.2 is reached through a name that resolves to it."""
    settings.STEPWISE_EGRESS = LOOPBACK
    with HostileServer(host="127.0.0.2") as elsewhere:
        dns["second.example"] = ["127.0.0.2"]
        response = call(f"http://second.example:{elsewhere.port}/ok")
        assert response.status_code == 200 and len(elsewhere.requests) == 1
    dns["private.example"] = ["10.1.2.3"]
    with pytest.raises(EgressRefused) as refused:
        call("http://private.example:8080/")
    assert str(refused.value) == (
        "egress policy refuses private.example:8080: it resolves to 10.1.2.3; 10.1.2.3 is a "
        "private address, refused unless an operator allows it")
