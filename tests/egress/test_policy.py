"""The egress policy's decisions: addresses, hosts, ports, schemes, and reading the setting."""
import ipaddress

import pytest
from django.core.exceptions import ImproperlyConfigured

from orchestrator.integrations.egress import DEFAULT_POLICY, Policy, policy_for, policy_for_base_url
from orchestrator.integrations.egress.policy import (
    address_refusal,
    classify_address,
    config_problems,
    host_matches,
    literal_address,
    origin_refusal,
)


@pytest.mark.parametrize("address, category", [
    ("127.0.0.1", "loopback"), ("127.255.0.9", "loopback"), ("::1", "loopback"),
    ("10.1.2.3", "private"), ("172.16.0.1", "private"), ("172.31.255.255", "private"),
    ("192.168.1.1", "private"), ("fd12:3456::1", "private"), ("fc00::1", "private"),
    ("169.254.169.254", "metadata"), ("169.254.170.2", "metadata"),
    ("100.100.100.200", "metadata"), ("fd00:ec2::254", "metadata"),
    ("169.254.1.1", "link_local"), ("fe80::1", "link_local"),
    ("100.64.0.1", "shared"), ("100.127.255.254", "shared"),
    ("224.0.0.1", "multicast"), ("239.1.2.3", "multicast"), ("ff02::1", "multicast"),
    ("0.0.0.0", "unspecified"), ("0.1.2.3", "unspecified"), ("::", "unspecified"),
    ("192.0.2.1", "reserved"), ("198.18.0.1", "reserved"), ("240.0.0.1", "reserved"),
    ("255.255.255.255", "reserved"), ("2001:db8::1", "reserved"),
    # IPv4 inside IPv6 is judged as the IPv4 address it reaches.
    ("::ffff:127.0.0.1", "loopback"), ("::ffff:169.254.169.254", "metadata"),
    ("::ffff:10.0.0.1", "private"), ("64:ff9b::7f00:1", "loopback"),
    ("2002:a00:1::1", "private"), ("::127.0.0.1", "loopback"),
])
def test_refused_ranges_are_classified(address, category):
    assert classify_address(ipaddress.ip_address(address))[0] == category


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700::1111",
                                     "::ffff:93.184.216.34", "64:ff9b::5db8:d822"])
def test_global_addresses_are_not_refused(address):
    assert classify_address(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize("host, address", [
    ("127.0.0.1", "127.0.0.1"), ("127.1", "127.0.0.1"), ("2130706433", "127.0.0.1"),
    ("0x7f000001", "127.0.0.1"), ("0x7f.1", "127.0.0.1"), ("0177.0.0.1", "127.0.0.1"),
    ("localhost", "127.0.0.1"), ("api.localhost", "127.0.0.1"), ("LOCALHOST.", "127.0.0.1"),
    ("[::1]", "::1"), ("[::ffff:127.0.0.1]", "::ffff:127.0.0.1"), ("0", "0.0.0.0"),
    ("example.com", None), ("beef.cafe", None), ("1.2.3.4.example.com", None),
])
def test_every_spelling_of_an_address_literal_is_read_as_the_address(host, address):
    expected = ipaddress.ip_address(address) if address else None
    assert literal_address(host) == expected


def test_allow_networks_opens_exactly_the_networks_named():
    policy = Policy(allow_networks=(ipaddress.ip_network("127.0.0.0/8"),))
    assert address_refusal(ipaddress.ip_address("127.0.0.1"), host="x", policy=policy) is None
    # An IPv4-mapped address is allowed by its IPv4 network.
    assert address_refusal(ipaddress.ip_address("::ffff:127.0.0.1"), host="x", policy=policy) is None
    assert "private" in address_refusal(ipaddress.ip_address("10.0.0.1"), host="x", policy=policy)
    assert "loopback" in address_refusal(ipaddress.ip_address("::1"), host="x", policy=policy)


def test_internal_hosts_open_internal_ranges_for_that_name_but_never_metadata():
    policy = Policy(internal_hosts=("ollama",))
    for address in ("172.18.0.5", "127.0.0.1", "100.64.1.1"):
        assert address_refusal(ipaddress.ip_address(address), host="ollama", policy=policy) is None
        assert address_refusal(ipaddress.ip_address(address), host="other", policy=policy)
    for address in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200", "169.254.1.1"):
        assert address_refusal(ipaddress.ip_address(address), host="ollama", policy=policy)


@pytest.mark.parametrize("host, patterns, expected", [
    ("api.example.com", ["*"], True),
    ("api.example.com", ["api.example.com"], True),
    ("api.example.com", ["*.example.com"], True),
    ("example.com", ["*.example.com"], False),
    ("evil-example.com", ["*.example.com"], False),
    ("api.example.com.evil.io", ["api.example.com"], False),
    ("api.example.com", [], False),
])
def test_host_patterns(host, patterns, expected):
    assert host_matches(host, patterns) is expected


@pytest.mark.parametrize("scheme, host, port, refused", [
    ("https", "api.example.com", None, None),
    ("http", "api.example.com", 80, None),
    ("HTTPS", "API.example.com.", 443, None),
    ("file", "", None, "scheme 'file'"),
    ("gopher", "127.0.0.1", 70, "scheme 'gopher'"),
    ("https", "api.example.com", 8443, "port 8443"),
    ("http", "api.example.com", 6379, "port 6379"),
])
def test_the_default_policy_allows_http_and_https_on_their_ports(scheme, host, port, refused):
    reason = origin_refusal(scheme, host, port, DEFAULT_POLICY)
    assert (reason is None) if refused is None else (refused in reason)


def test_policy_layers_default_then_tool_then_team_then_team_tool(settings):
    settings.STEPWISE_EGRESS = {
        "default": {"hosts": ["*.example.com"], "max_response_bytes": 1000},
        "tools": {"http.request": {"ports": [443, 8443]}},
        "teams": {"payments": {"hosts": ["api.stripe.com"], "max_response_bytes": 5000,
                               "tools": {"http.request": {"ports": "*"}}}},
    }
    plain = policy_for(tool="crm.lookup")
    assert plain.hosts == ("*.example.com",) and plain.ports == frozenset({80, 443})
    tool = policy_for(tool="http.request", team="support")
    assert tool.hosts == ("*.example.com",) and tool.ports == frozenset({443, 8443})
    assert tool.max_response_bytes == 1000
    team = policy_for(tool="http.request", team="payments")
    assert team.hosts == ("api.stripe.com",) and team.ports is None
    assert team.max_response_bytes == 5000
    assert policy_for(tool="webhook", team="payments").ports == frozenset({80, 443})


def test_an_unset_setting_is_the_default_policy(settings):
    settings.STEPWISE_EGRESS = {}
    assert policy_for(tool="http.request", team="support") == DEFAULT_POLICY
    assert DEFAULT_POLICY.schemes == {"http", "https"} and DEFAULT_POLICY.allow_networks == ()


@pytest.mark.parametrize("config, message", [
    ({"defaults": {}}, "unknown keys ['defaults']"),
    ({"default": {"schemes": ["ftp"]}}, "only http and https"),
    ({"default": {"ports": [0]}}, "port numbers"),
    ({"default": {"ports": "any"}}, "port numbers"),
    ({"default": {"allow_networks": ["10.0.0.0/33"]}}, "allow_networks"),
    ({"default": {"hosts": "*"}}, "list of non-empty strings"),
    ({"default": {"max_response_bytes": 0}}, "max_response_bytes must be an integer >= 1"),
    ({"tools": {"http.request": {"allow": ["x"]}}}, "tools.http.request: unknown keys"),
    ({"tools": {"http.request": {"tools": {}}}}, "tools.http.request: unknown keys"),
    ({"teams": {"payments": {"tools": {"http.request": {"portz": [1]}}}}},
     "teams.payments.tools.http.request: unknown keys"),
    ({"teams": {"payments": []}}, "teams.payments must be an object"),
])
def test_a_malformed_setting_is_reported_with_its_path(settings, config, message):
    settings.STEPWISE_EGRESS = config
    problems = config_problems()
    assert any(message in problem for problem in problems), problems


def test_a_malformed_setting_fails_the_system_check(settings):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    settings.STEPWISE_EGRESS = {"default": {"schemes": ["file"]}}
    with pytest.raises(SystemCheckError, match="only http and https"):
        call_command("check")
    with pytest.raises(ImproperlyConfigured):
        policy_for(tool="http.request")


def test_a_configured_base_url_allows_its_origin_and_nothing_else():
    policy = policy_for_base_url("http://127.0.0.1:11434/v1/chat/completions",
                                 max_response_bytes=100)
    assert origin_refusal("http", "127.0.0.1", 11434, policy) is None
    assert origin_refusal("http", "127.0.0.1", 11435, policy)
    assert origin_refusal("https", "127.0.0.1", 11434, policy)
    assert origin_refusal("http", "localhost", 11434, policy)
    assert address_refusal(ipaddress.ip_address("127.0.0.1"), host="127.0.0.1", policy=policy) is None
    by_name = policy_for_base_url("http://ollama:11434/v1", max_response_bytes=100)
    assert address_refusal(ipaddress.ip_address("172.18.0.5"), host="ollama", policy=by_name) is None
    assert address_refusal(ipaddress.ip_address("169.254.169.254"), host="ollama", policy=by_name)
    with pytest.raises(ValueError):
        policy_for_base_url("file:///etc/passwd", max_response_bytes=100)
