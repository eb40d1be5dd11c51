"""The guarded transport at its edges (from the mutation survivors of
orchestrator/integrations/egress/transport.py): what a refusal of a request or a redirect hop
says and names, and how the call's one deadline bounds each phase. Real local servers; the
system resolver is only watched, to see which names are looked up."""

import socket

import pytest

from orchestrator.integrations import egress
from orchestrator.integrations.egress import EgressRefused
from tests.support.hostile_server import HostileServer


@pytest.fixture
def server():
    with HostileServer() as running:
        yield running


@pytest.fixture
def lookups(monkeypatch):
    """The names looked up during the test, in order (the system resolver still answers)."""
    asked, real = [], socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        asked.append(host)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return asked


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
    settings, lookups, url, shown, reason
):
    """The range is the refusal even where the port is refused too, and it is decided from the
    URL's text: the name is never looked up."""
    settings.STEPWISE_EGRESS = {}
    with pytest.raises(EgressRefused) as refused:
        call(url)
    assert str(refused.value) == (
        f"egress policy refuses {shown}: {reason}, refused unless an operator allows it"
    )
    assert refused.value.url == shown
    assert lookups == []


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
