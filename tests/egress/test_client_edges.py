"""The egress client at its edges (from the mutation survivors of
orchestrator/integrations/egress/client.py): what a refusal of an oversized response or of one
redirect too many names, the URL a followed response reports, and the body a call sends.
Against real local servers."""

import ipaddress
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from orchestrator.integrations import egress
from orchestrator.integrations.egress import EgressRefused, Policy, ResponseTooLarge
from tests.support.hostile_server import HostileServer

LOOPBACK = Policy(ports=None, allow_networks=(ipaddress.ip_network("127.0.0.0/8"),))
CAP = 1024 * 1024


@pytest.fixture
def server():
    with HostileServer() as running:
        yield running


@pytest.mark.parametrize(
    "path, size",
    [
        ("/big?mb=2&token=secret", "declares 2097152 bytes"),
        ("/chunked?mb=2", "exceeds 1048576 bytes"),
    ],
)
def test_an_oversized_response_is_refused_naming_its_url_without_the_query(server, path, size):
    """A declared length over the cap is refused as declared, unread; a body of no declared
    length is refused as it passes the cap."""
    with pytest.raises(ResponseTooLarge) as refused:
        egress.request("GET", f"{server.url}{path}#part", policy=LOOPBACK, deadline_s=5)
    shown = f"{server.url}{path.split('?')[0]}"
    assert str(refused.value) == (
        f"the response of {shown} {size}; the limit is {CAP} bytes "
        "(max_response_bytes in STEPWISE_EGRESS)"
    )
    assert (refused.value.url, refused.value.limit) == (shown, CAP)


def test_one_redirect_too_many_is_refused_naming_the_hop_without_its_query(server):
    policy = Policy(ports=None, allow_networks=LOOPBACK.allow_networks, max_redirects=1)
    target = f"{server.url}/redirect?to={server.url}/ok%3Ftoken%3Dsecret"
    with pytest.raises(EgressRefused) as refused:
        egress.request(
            "GET",
            f"{server.url}/redirect?to={target.replace('?', '%3F').replace('=', '%3D')}",
            policy=policy,
            deadline_s=5,
            follow_redirects=True,
        )
    assert str(refused.value) == (
        f"egress policy refuses {server.url}/redirect: more than 1 redirects (max_redirects)"
    )
    none = Policy(ports=None, allow_networks=LOOPBACK.allow_networks, max_redirects=0)
    with pytest.raises(EgressRefused) as refused:
        egress.request(
            "GET",
            f"{server.url}/redirect?to={server.url}/ok#part",
            policy=none,
            deadline_s=5,
            follow_redirects=True,
        )
    assert refused.value.url == f"{server.url}/redirect"


def test_a_followed_response_reports_the_url_it_came_from(server):
    response = egress.request(
        "GET",
        f"{server.url}/redirect?to={server.url}/ok",
        policy=LOOPBACK,
        deadline_s=5,
        follow_redirects=True,
    )
    assert response.url == f"{server.url}/ok"
    assert egress.request("GET", f"{server.url}/ok", policy=LOOPBACK, deadline_s=5).url == (
        f"{server.url}/ok"
    )


@pytest.fixture
def recorder():
    """A server that answers 204 and keeps each request's body."""
    bodies = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            bodies.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            self.send_response(204)
            self.end_headers()

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    httpd.bodies = bodies
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_a_body_given_as_content_is_sent_as_is(recorder):
    url = f"http://127.0.0.1:{recorder.server_address[1]}/hook"
    response = egress.request("POST", url, policy=LOOPBACK, deadline_s=5, content=b"raw \x00 bytes")
    assert response.status_code == 204
    assert recorder.bodies == [b"raw \x00 bytes"]
