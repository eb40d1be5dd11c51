"""The egress policy's edges: a configured base URL's exact origin, every bound of the setting,
and the words of each refusal (from the mutation survivors of orchestrator/integrations/egress/policy.py)."""
import ipaddress

import pytest
from django.core.exceptions import ImproperlyConfigured

from orchestrator.integrations.egress import Policy, policy_for, policy_for_base_url
from orchestrator.integrations.egress.policy import (
    address_refusal,
    config_problems,
    literal_address,
    origin_refusal,
)


def ip(text: str):
    return ipaddress.ip_address(text)


def test_a_base_urls_host_is_read_without_its_trailing_dot():
    policy = policy_for_base_url("http://Ollama.:11434/v1", max_response_bytes=100)
    assert policy.hosts == ("ollama",) and policy.internal_hosts == ("ollama",)
    assert origin_refusal("http", "ollama", 11434, policy) is None
    assert address_refusal(ip("172.18.0.5"), host="ollama", policy=policy) is None


@pytest.mark.parametrize("url", ["http:///v1", "ftp://models.example.com/", "file:///etc/passwd"])
def test_a_base_url_without_an_http_scheme_and_a_host_is_refused_by_name(url):
    with pytest.raises(ValueError) as refused:
        policy_for_base_url(url, max_response_bytes=100)
    assert str(refused.value) == f"{url!r} is not an http(s) URL with a host"


@pytest.mark.parametrize("address", ["169.254.10.1", "192.0.2.7"])
def test_a_base_url_written_as_an_address_allows_that_address_whatever_its_range(address):
    """An operator's own address literal is explicit: even link-local or reserved space,
    which a host name never opens."""
    policy = policy_for_base_url(f"http://{address}:8080/v1", max_response_bytes=100)
    assert policy.allow_networks == (ipaddress.ip_network(address),)
    assert address_refusal(ip(address), host=address, policy=policy) is None
    by_name = policy_for_base_url("http://models:8080/v1", max_response_bytes=100)
    assert by_name.allow_networks == ()
    assert address_refusal(ip(address), host="models", policy=by_name)


def test_a_reserved_address_is_refused_in_words():
    assert address_refusal(ip("192.0.2.1"), host="x", policy=Policy()) == (
        "192.0.2.1 is a reserved or non-global address, refused unless an operator allows it")


@pytest.mark.parametrize("config, problems", [
    ({"default": {"hosts": "*"}},
     ["STEPWISE_EGRESS.default.hosts must be a list of non-empty strings"]),
    ({"default": {"hosts": [""]}},
     ["STEPWISE_EGRESS.default.hosts must be a list of non-empty strings"]),
    # Only a team's layer holds per-tool layers: not the default, nor a team's tool layer.
    ({"default": {"tools": {}}}, ["STEPWISE_EGRESS.default: unknown keys ['tools']; known: "
                                  "schemes, hosts, deny_hosts, ports, allow_networks, "
                                  "internal_hosts, max_response_bytes, max_redirects"]),
    ({"teams": {"p": {"tools": {"http.request": {"tools": {}}}}}},
     ["STEPWISE_EGRESS.teams.p.tools.http.request: unknown keys ['tools']; known: "
      "schemes, hosts, deny_hosts, ports, allow_networks, internal_hosts, "
      "max_response_bytes, max_redirects"]),
    ({"teams": {"p": {"tools": []}}}, ["STEPWISE_EGRESS.teams.p.tools must be an object"]),
    ({"default": {"ports": [65536]}},
     ['STEPWISE_EGRESS.default.ports must be "*" or a list of port numbers']),
    # Every layer is read: a team's per-tool layers do not hide the layers before them.
    ({"default": {"ports": [0]}, "teams": {"p": {"tools": {"http.request": {"hosts": 1}}}}},
     ['STEPWISE_EGRESS.default.ports must be "*" or a list of port numbers',
      "STEPWISE_EGRESS.teams.p.tools.http.request.hosts must be a list of non-empty strings"]),
])
def test_each_malformed_layer_is_reported_in_full(settings, config, problems):
    settings.STEPWISE_EGRESS = config
    assert config_problems() == problems


def test_a_well_formed_setting_has_no_problem_and_every_port_number_is_one(settings):
    settings.STEPWISE_EGRESS = {
        "default": {"ports": [1, 65535]},
        "teams": {"p": {"hosts": ["api.example.com"],
                        "tools": {"http.request": {"ports": "*"}}}},
    }
    assert config_problems() == []


@pytest.mark.parametrize("layer, message", [
    ({"schemes": "https"}, "STEPWISE_EGRESS.default.schemes must be a list of non-empty strings"),
    ({"ports": "any"}, 'STEPWISE_EGRESS.default.ports must be "*" or a list of port numbers'),
    ({"allow_networks": "10.0.0.0/8"},
     "STEPWISE_EGRESS.default.allow_networks must be a list of non-empty strings"),
    ({"max_redirects": True}, "STEPWISE_EGRESS.default.max_redirects must be an integer >= 0"),
    ({"max_redirects": -1}, "STEPWISE_EGRESS.default.max_redirects must be an integer >= 0"),
    ({"max_response_bytes": False},
     "STEPWISE_EGRESS.default.max_response_bytes must be an integer >= 1"),
])
def test_a_malformed_key_is_named_with_its_path(settings, layer, message):
    settings.STEPWISE_EGRESS = {"default": layer}
    assert config_problems() == [message]


def test_every_key_of_a_layer_is_read_into_the_policy(settings):
    settings.STEPWISE_EGRESS = {"default": {
        "schemes": ["http", "HTTPS"], "hosts": ["API.Example.com.", "*.EXAMPLE.BOX."],
        "deny_hosts": ["Admin.Example.com."], "internal_hosts": ["Ollama."],
        # A network written with host bits set is read as the network that holds it.
        "allow_networks": ["10.20.0.1/16"],
        "max_response_bytes": 1, "max_redirects": 0,
    }}
    assert config_problems() == []
    policy = policy_for(tool="http.request")
    assert policy == Policy(
        schemes=frozenset({"http", "https"}), hosts=("api.example.com", "*.example.box"),
        deny_hosts=("admin.example.com",), internal_hosts=("ollama",),
        allow_networks=(ipaddress.ip_network("10.20.0.0/16"),),
        max_response_bytes=1, max_redirects=0)
    assert origin_refusal("HTTPS", "api.example.com", None, policy) is None
    assert address_refusal(ip("10.20.3.4"), host="x", policy=policy) is None


def test_a_call_for_no_team_reads_no_teams_layer_and_a_malformed_layer_is_named(settings):
    settings.STEPWISE_EGRESS = {"teams": {"XXXX": {"ports": "*"}, "": {"ports": "*"}}}
    assert policy_for(tool="http.request").ports == frozenset({80, 443})
    settings.STEPWISE_EGRESS = {"default": {"hosts": "*"}}
    with pytest.raises(ImproperlyConfigured) as refused:
        policy_for(tool="http.request")
    assert str(refused.value) == "STEPWISE_EGRESS.default.hosts must be a list of non-empty strings"


def test_a_hosts_trailing_dot_and_case_are_ignored_by_every_decision():
    policy = Policy(hosts=("api.example.box",), internal_hosts=("models.box",))
    assert origin_refusal("https", "API.Example.BOX.", None, policy) is None
    assert address_refusal(ip("10.0.0.1"), host="Models.BOX.", policy=policy) is None


@pytest.mark.parametrize("policy, scheme, port, reason", [
    (Policy(), "ftp", None, "the scheme 'ftp' is not allowed (allowed: http, https)"),
    (Policy(schemes=frozenset()), "http", None, "the scheme 'http' is not allowed (allowed: none)"),
    (Policy(ports=frozenset({443, 80, 8443})), "https", 6379,
     "the port 6379 is not allowed (allowed: 80, 443, 8443)"),
    (Policy(ports=frozenset()), "https", None, "the port 443 is not allowed (allowed: none)"),
])
def test_an_origins_refusal_names_what_is_allowed(policy, scheme, port, reason):
    assert origin_refusal(scheme, "api.example.com", port, policy) == reason


@pytest.mark.parametrize("host, address", [
    # An upper-case X is no hex marker; the historical forms need 0x.
    ("0X7F.1X", None), ("0X7F.1X.", None),
    # A zone is not part of the address; only the first % starts one.
    ("fe80::1%eth0", "fe80::1"), ("[fe80::1%a%b]", "fe80::1"),
    # inet_aton would read what follows a space as nothing: a name, not 127.0.0.1.
    ("127.0.0.1 x", None),
])
def test_address_literals_at_the_edges(host, address):
    assert literal_address(host) == (ip(address) if address else None)


@pytest.mark.parametrize("config, problem", [
    (["default"], "STEPWISE_EGRESS must be a JSON object"),
    ({"tools": []}, "STEPWISE_EGRESS.tools must be an object"),
    ({"teams": "payments"}, "STEPWISE_EGRESS.teams must be an object"),
])
def test_a_malformed_setting_as_a_whole_is_named(settings, config, problem):
    settings.STEPWISE_EGRESS = config
    assert config_problems() == [problem]
    with pytest.raises(ImproperlyConfigured) as refused:
        policy_for(tool="http.request", team="payments")
    assert str(refused.value) == problem


def test_a_teams_malformed_tools_refuses_that_teams_calls_by_name(settings):
    settings.STEPWISE_EGRESS = {"teams": {"payments": {"tools": ["http.request"]}}}
    with pytest.raises(ImproperlyConfigured) as refused:
        policy_for(tool="http.request", team="payments")
    assert str(refused.value) == "STEPWISE_EGRESS.teams.payments.tools must be an object"


def test_without_the_setting_every_call_has_the_default_policy(settings):
    del settings.STEPWISE_EGRESS
    assert policy_for(tool="http.request", team="payments") == Policy()
    assert config_problems() == []
