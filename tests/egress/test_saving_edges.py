"""The save-time check of a URL's literal text at its edges (from the mutation survivors of
orchestrator/integrations/egress/static.py): where the literal part ends, how a host and a port are read
from it, and the words of each refusal."""
import pytest

from orchestrator.integrations.egress import Policy, url_problems

ONLY_API = Policy(hosts=("api.example.box",))
ANY_PORT = Policy(ports=None)


def refused(text: str, reason: str) -> list[str]:
    return [f"egress policy refuses {text!r}: {reason}"]


@pytest.mark.parametrize("text, policy, problems", [
    ("file:///etc/{{ input.name }}", Policy(),
     refused("file:///etc/{{ input.name }}",
             "the scheme 'file' is not allowed (allowed: http, https)")),
    ("https://api.example.com:6379/", Policy(),
     refused("https://api.example.com:6379/", "the port 6379 is not allowed (allowed: 80, 443)")),
    # The literal part ends at the first template: a host decided at run time is not judged
    # by a port written after it.
    ("https://{{ input.host }}:6379/{{ input.path }}", Policy(), []),
    # An upper-case X is part of the host, not where it ends.
    ("https://XAPI.example.com:6379/", Policy(),
     refused("https://XAPI.example.com:6379/", "the port 6379 is not allowed (allowed: 80, 443)")),
    ("https://API.EXAMPLE.BOX/v1", ONLY_API, []),
    ("https://API.EXAMPLE.BOX:443/v1", ONLY_API, []),
    ("https://.api.example.box:443/", ONLY_API,
     refused("https://.api.example.box:443/",
             "the host '.api.example.box' is not in the allowed hosts")),
    ("https://.api.example.box/", ONLY_API,
     refused("https://.api.example.box/", "the host '.api.example.box' is not in the allowed hosts")),
    # A user and a templated password: the colon is not a port's, so the host is undecided.
    ("http://user:{{ input.password }}@api.example.box/", ONLY_API, []),
    # A literal host before a templated port: the host is judged, the port left to run time.
    ("https://api.example.box:{{ input.port }}/", Policy(hosts=("api.example.box",),
                                                        ports=frozenset({8443})), []),
    ("http://a:{{ input.port }}/", ONLY_API,
     refused("http://a:{{ input.port }}/", "the host 'a' is not in the allowed hosts")),
    ("http://api.example.box:x:{{ input.port }}/", ONLY_API, []),
    ("http://[fd00::1]:{{ input.port }}/", Policy(),
     refused("http://[fd00::1]:{{ input.port }}/",
             "fd00::1 is a private address, refused unless an operator allows it")),
    ("http://[::1]:[2]:{{ input.port }}/", Policy(),
     refused("http://[::1]:[2]:{{ input.port }}/",
             "::1 is a loopback address, refused unless an operator allows it")),
    ("http://[fd00::{{ input.suffix }}]/", Policy(), []),
    ("http://[]:{{ input.port }}/", Policy(),
     refused("http://[]:{{ input.port }}/", "it has no valid host")),
])
def test_what_the_literal_part_of_a_url_shows(text, policy, problems):
    assert url_problems(text, policy) == problems


@pytest.mark.parametrize("text, problem", [
    ("http://[fd00::1]:80/", "fd00::1 is a private address, refused unless an operator allows it"),
    ("https://[2606:4700::1]:6379/", "the port 6379 is not allowed (allowed: 80, 443)"),
    ("http://[fd00::1/", "it has no valid host"),
    ("http://[fd00::1]x]:80/", "it has no valid host"),
    ("https://api.example.com:0/", "it has no valid host"),
    ("https://api.example.com:65536/", "it has no valid host"),
])
def test_a_host_and_port_are_read_exactly(text, problem):
    assert url_problems(text, Policy()) == refused(text, problem)


@pytest.mark.parametrize("port", [1, 65535])
def test_every_port_number_is_a_port(port):
    assert url_problems(f"https://api.example.com:{port}/", ANY_PORT) == []
