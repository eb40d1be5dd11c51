"""The egress policy: which URLs and which addresses an outbound call may reach.

Owns the `Policy` value, reading it from the STEPWISE_EGRESS setting (a default, per-tool and
per-team layers), and the pure decisions made with it: whether a scheme, host and port are
allowed (`origin_refusal`), and whether an address is (`address_refusal`). It makes no network
call and resolves no name: the transport (`transport.py`) resolves, then asks here about every
address it would connect to; the save-time check (`static.py`) asks about a URL's literal text.

Addresses are judged after resolution, so every spelling of one (`2130706433`, `0x7f000001`,
`127.1`, `[::ffff:127.0.0.1]`) is judged as the address it is. Loopback, private (RFC 1918,
ULA), shared (CGNAT), link-local, multicast, unspecified, cloud metadata and every other
non-global range are refused unless a policy allows them explicitly.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

SUPPORTED_SCHEMES = frozenset({"http", "https"})
DEFAULT_PORTS = {"http": 80, "https": 443}
MiB = 1024 * 1024


def _nets(*cidrs: str) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(cidr) for cidr in cidrs)


# The ranges refused by default, in the order an address is classified: the first that holds
# it names the refusal. Metadata comes first because its addresses sit inside link-local, ULA
# and shared space, and an allowance for those must not open it.
REFUSED_RANGES: tuple[tuple[str, str, tuple[IPNetwork, ...]], ...] = (
    ("metadata", "a cloud metadata address", _nets(
        "169.254.169.254/32",  # AWS, GCP, Azure, OpenStack, DigitalOcean ...
        "169.254.170.2/32",  # AWS ECS task metadata
        "100.100.100.200/32",  # Alibaba Cloud
        "fd00:ec2::254/128",  # AWS over IPv6
    )),
    ("unspecified", "an unspecified address", _nets("0.0.0.0/8", "::/128")),
    ("loopback", "a loopback address", _nets("127.0.0.0/8", "::1/128")),
    ("link_local", "a link-local address", _nets("169.254.0.0/16", "fe80::/10")),
    ("multicast", "a multicast address", _nets("224.0.0.0/4", "ff00::/8")),
    ("private", "a private address", _nets(
        "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")),
    ("shared", "a shared (carrier-grade NAT) address", _nets("100.64.0.0/10")),
)
# What `internal_hosts` may open: the networks an operator's own services live on. Metadata,
# link-local, multicast and unspecified addresses need `allow_networks`, never a host name.
INTERNAL = frozenset({"loopback", "private", "shared"})
_NAT64 = _nets("64:ff9b::/96", "64:ff9b:1::/48")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


@dataclass(frozen=True)
class Policy:
    """Where one caller's outbound calls may go, and how much they may bring back."""

    schemes: frozenset[str] = frozenset({"http", "https"})
    # Host patterns (`api.example.com`, `*.example.com`, `*`), matched against the URL's host.
    hosts: tuple[str, ...] = ("*",)
    # Host patterns refused even when `hosts` allows them (e.g. the product's own name).
    deny_hosts: tuple[str, ...] = ()
    # Allowed ports; None means any port.
    ports: frozenset[int] | None = frozenset({80, 443})
    # Networks allowed although a refused range holds them (e.g. 10.20.0.0/16 for an API).
    allow_networks: tuple[IPNetwork, ...] = ()
    # Host patterns whose loopback, private or shared addresses are allowed (an operator's own
    # service by name, e.g. a model server `ollama` in docker-compose).
    internal_hosts: tuple[str, ...] = ()
    # The largest response body read; a larger one is refused, never stored.
    max_response_bytes: int = MiB
    # Redirect hops followed when a caller asks to follow them (each hop is checked again).
    max_redirects: int = 5


DEFAULT_POLICY = Policy()


# --- reading STEPWISE_EGRESS ---------------------------------------------------------------

_LAYER_KEYS = ("schemes", "hosts", "deny_hosts", "ports", "allow_networks", "internal_hosts",
               "max_response_bytes", "max_redirects")


def policy_for(*, tool: str, team: str = "") -> Policy:
    """The policy of calls made by `tool` (a tool name, or a caller such as `webhook`) for
    `team` (a team slug): STEPWISE_EGRESS's `default`, then `tools.<tool>`, then
    `teams.<team>`, then `teams.<team>.tools.<tool>`; each layer replaces the keys it names.

    Raises ImproperlyConfigured for a malformed setting.
    """
    config = _config()
    layers = [("default", config.get("default")), (f"tools.{tool}", _get(config, "tools", tool))]
    if team:
        team_layer = _get(config, "teams", team)
        layers.append((f"teams.{team}", team_layer))
        if isinstance(team_layer, Mapping):
            layers.append((f"teams.{team}.tools.{tool}", _get(team_layer, "tools", tool)))
    policy = DEFAULT_POLICY
    for where, layer in layers:
        if layer is not None:
            policy = _apply(policy, layer, where=f"STEPWISE_EGRESS.{where}",
                            team_layer=where == f"teams.{team}")
    return policy


def policy_for_base_url(base_url: str, *, max_response_bytes: int) -> Policy:
    """The policy of calls to a URL an operator configured (a model provider's `base_url`):
    exactly its scheme, host and port; whatever the host is — a name resolving to an internal
    address, or an address literal of any kind — counts as explicitly allowed, except that a
    name never opens metadata or link-local addresses.

    Raises ValueError for a URL without an http(s) scheme and a host.
    """
    parts = urlsplit(base_url)
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").rstrip(".").lower()
    if scheme not in SUPPORTED_SCHEMES or not host:
        raise ValueError(f"{base_url!r} is not an http(s) URL with a host")
    port = parts.port or DEFAULT_PORTS[scheme]
    literal = literal_address(host)
    allow = (ipaddress.ip_network(literal),) if literal is not None else ()
    return Policy(schemes=frozenset({scheme}), hosts=(host,), ports=frozenset({port}),
                  allow_networks=allow, internal_hosts=(host,),
                  max_response_bytes=max_response_bytes)


def config_problems() -> list[str]:
    """Every layer of STEPWISE_EGRESS that cannot be read (for the system check)."""
    try:
        config = _config()
    except ImproperlyConfigured as error:
        return [str(error)]
    problems = []
    # (where, layer, whether it is a team's layer, which may hold per-tool layers)
    layers = [("default", config.get("default"), False)]
    layers += [(f"tools.{name}", layer, False) for name, layer in (config.get("tools") or {}).items()]
    for team, team_layer in (config.get("teams") or {}).items():
        layers.append((f"teams.{team}", team_layer, True))
        if isinstance(team_layer, Mapping) and isinstance(team_layer.get("tools"), Mapping):
            layers += [(f"teams.{team}.tools.{name}", layer, False)
                       for name, layer in team_layer["tools"].items()]
    for where, layer, team_layer in layers:
        if layer is None:
            continue
        try:
            _apply(DEFAULT_POLICY, layer, where=f"STEPWISE_EGRESS.{where}", team_layer=team_layer)
        except ImproperlyConfigured as error:
            problems.append(str(error))
    return problems


def _config() -> Mapping:
    config = getattr(settings, "STEPWISE_EGRESS", None) or {}
    if not isinstance(config, Mapping):
        raise ImproperlyConfigured("STEPWISE_EGRESS must be a JSON object")
    unknown = set(config) - {"default", "tools", "teams"}
    if unknown:
        raise ImproperlyConfigured(
            f"STEPWISE_EGRESS: unknown keys {sorted(unknown)}; use default, tools, teams")
    for key in ("tools", "teams"):
        if not isinstance(config.get(key, {}), Mapping):
            raise ImproperlyConfigured(f"STEPWISE_EGRESS.{key} must be an object")
    return config


def _get(config: Mapping, key: str, name: str) -> object:
    section = config.get(key) or {}
    return section.get(name) if isinstance(section, Mapping) else None


def _apply(policy: Policy, layer: object, *, where: str, team_layer: bool) -> Policy:
    """`policy` with the keys `layer` names replaced. A team's layer may also hold `tools`
    (its per-tool layers, applied after it by the caller)."""
    if not isinstance(layer, Mapping):
        raise ImproperlyConfigured(f"{where} must be an object")
    allowed_keys = (*_LAYER_KEYS, "tools") if team_layer else _LAYER_KEYS
    if not isinstance(layer.get("tools", {}), Mapping):
        raise ImproperlyConfigured(f"{where}.tools must be an object")
    unknown = set(layer) - set(allowed_keys)
    if unknown:
        raise ImproperlyConfigured(
            f"{where}: unknown keys {sorted(unknown)}; known: {', '.join(allowed_keys)}")
    changes: dict = {}
    if "schemes" in layer:
        # Schemes are compared in lower case, as URLs' are: `HTTPS` is https.
        schemes = frozenset(s.lower() for s in _strings(layer["schemes"], f"{where}.schemes"))
        if not schemes <= SUPPORTED_SCHEMES:
            raise ImproperlyConfigured(f"{where}.schemes: only http and https are supported")
        changes["schemes"] = schemes
    for key in ("hosts", "deny_hosts", "internal_hosts"):
        if key in layer:
            changes[key] = tuple(h.rstrip(".").lower() for h in
                                 _strings(layer[key], f"{where}.{key}"))
    if "ports" in layer:
        changes["ports"] = _ports(layer["ports"], f"{where}.ports")
    if "allow_networks" in layer:
        networks = []
        for cidr in _strings(layer["allow_networks"], f"{where}.allow_networks"):
            try:
                networks.append(ipaddress.ip_network(cidr, strict=False))
            except ValueError as error:
                raise ImproperlyConfigured(f"{where}.allow_networks: {error}") from None
        changes["allow_networks"] = tuple(networks)
    for key, minimum in (("max_response_bytes", 1), ("max_redirects", 0)):
        if key in layer:
            value = layer[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ImproperlyConfigured(f"{where}.{key} must be an integer >= {minimum}")
            changes[key] = value
    return replace(policy, **changes)


def _strings(value: object, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ImproperlyConfigured(f"{where} must be a list of non-empty strings")
    return value


def _ports(value: object, where: str) -> frozenset[int] | None:
    if value == "*":
        return None
    if not isinstance(value, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and 0 < p < 65536 for p in value):
        raise ImproperlyConfigured(f'{where} must be "*" or a list of port numbers')
    return frozenset(value)


# --- decisions --------------------------------------------------------------------------------

def host_matches(host: str, patterns: Iterable[str]) -> bool:
    """Whether `host` (lower-case, no trailing dot) matches one of `patterns`.

    `*` matches every host and `*.example.com` every name under example.com (not example.com
    itself); any other pattern matches only itself.
    """
    return any(pattern == "*" or host == pattern
               or (pattern.startswith("*.") and fnmatchcase(host, pattern)) for pattern in patterns)


def origin_refusal(scheme: str, host: str, port: int | None, policy: Policy, *,
                   check_port: bool = True) -> str | None:
    """Why `scheme://host:port` is refused before any name is resolved, or None. A missing
    port is the scheme's default; `check_port=False` leaves an unknown port to run time."""
    scheme = scheme.lower()
    host = host.rstrip(".").lower()
    if scheme not in policy.schemes:
        return (f"the scheme {scheme!r} is not allowed "
                f"(allowed: {', '.join(sorted(policy.schemes)) or 'none'})")
    if host_matches(host, policy.deny_hosts):
        return f"the host {host!r} is refused (deny_hosts)"
    if not host_matches(host, policy.hosts):
        return f"the host {host!r} is not in the allowed hosts"
    port = port or DEFAULT_PORTS.get(scheme)
    if check_port and policy.ports is not None and port not in policy.ports:
        allowed = ", ".join(str(p) for p in sorted(policy.ports)) or "none"
        return f"the port {port} is not allowed (allowed: {allowed})"
    return None


def classify_address(address: IPAddress) -> tuple[str, str] | None:
    """(category, description) of the refused range that holds `address`, or None for a
    global address. An IPv4 address inside IPv6 (mapped, compatible, NAT64, 6to4) is judged
    as the IPv4 address it carries."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    for category, description, networks in REFUSED_RANGES:
        if any(address in network for network in networks):
            return category, description
    embedded = _embedded_ipv4(address)
    if embedded is not None:
        # Translated to (NAT64) or tunnelled over (6to4) IPv4: where it goes is the IPv4 address.
        return classify_address(embedded)
    if not address.is_global or address.is_reserved:
        return "reserved", "a reserved or non-global address"
    return None


def address_refusal(address: IPAddress, *, host: str, policy: Policy) -> str | None:
    """Why connecting to `address` (which `host` resolved to) is refused, or None."""
    plain = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) \
        and address.ipv4_mapped is not None else address
    if any(a in network for network in policy.allow_networks for a in {address, plain}
           if a.version == network.version):
        return None
    refused = classify_address(address)
    if refused is None:
        return None
    category, description = refused
    if category in INTERNAL and host_matches(host.rstrip(".").lower(), policy.internal_hosts):
        return None
    return f"{plain} is {description}, refused unless an operator allows it"


def literal_address(host: str) -> IPAddress | None:
    """The address a host written as an address literal stands for, in any spelling the
    system resolver accepts (`127.1`, `2130706433`, `0x7f000001`, `[::1]`), or None for a name.
    `localhost` and names under `.localhost` count as 127.0.0.1 (RFC 6761)."""
    host = host.strip("[]").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return ipaddress.IPv4Address("127.0.0.1")
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        pass
    # inet_aton reads the historical forms getaddrinfo accepts; a name such as `beef.cafe`
    # is no address (hex needs 0x), and anything but digits, dots and x is a name.
    if host and all(c in "0123456789abcdefx." for c in host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def _embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.sixtofour is not None:
        return address.sixtofour
    if any(address in network for network in _NAT64) or address in _IPV4_COMPATIBLE:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None
