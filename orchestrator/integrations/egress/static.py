"""The egress check made when a definition is saved: what a URL's literal text already shows.

Owns `url_problems` (one URL text against a policy) and `definition_checker` (the checker the
definition validator calls for each tool call's params). A URL is checked as far as it is
literal: a template decides the rest at run time, where the transport checks everything again
on the address actually connected to. So `file://{{ x }}` is refused here for its scheme,
`http://127.0.0.1/{{ path }}` for its address, and `https://{{ host }}/` passes to run time.
Names are never resolved here: a name's addresses are checked when the call is made.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from django.core.exceptions import ImproperlyConfigured

from ..tools.registry import all_tools
from .policy import (
    DEFAULT_PORTS,
    Policy,
    address_refusal,
    literal_address,
    origin_refusal,
    policy_for,
)

_TEMPLATE_STARTS = ("{{", "{%", "{#")

# (path inside the params, message) for each problem of one tool call's params.
Checker = Callable[[str, dict], Iterator[tuple[tuple, str]]]


def url_problems(text: str, policy: Policy) -> list[str]:
    """Why the policy refuses the URL `text` as far as its literal prefix shows ([] if not)."""
    starts = [text.find(mark) for mark in _TEMPLATE_STARTS if mark in text]
    literal = text[:min(starts)] if starts else text
    templated = bool(starts)
    scheme, sep, rest = literal.partition("://")
    if not sep:
        return []  # no literal scheme: a template, or not a URL (the tool's schema says so)
    scheme = scheme.lower()
    if scheme not in policy.schemes:
        return [_refused(text, origin_refusal(scheme, "", None, policy))]
    ends = [rest.find(mark) for mark in "/?#" if mark in rest]
    port_known = True
    if ends:
        authority = rest[:min(ends)]
    elif not templated:
        authority = rest
    elif "@" not in text and (host_end := _host_end(rest)) is not None:
        # `http://10.0.0.5:{{ port }}/`: the host is literal, the port is not.
        authority, port_known = rest[:host_end], False
    else:
        return []  # the host is not complete before the template
    parsed = _host_port(authority.rpartition("@")[2])
    if parsed is None:
        return [_refused(text, "it has no valid host")]
    host, port = parsed
    address = literal_address(host)
    # An address literal's range says more than its port: it is reported first.
    reason = address_refusal(address, host=host, policy=policy) if address else None
    reason = reason or origin_refusal(scheme, host, port or DEFAULT_PORTS[scheme], policy,
                                      check_port=port_known)
    return [_refused(text, reason)] if reason else []


def definition_checker(*, team: str) -> Checker:
    """The save-time checker of `team`'s definitions: each param a tool declares as a URL
    (`url_params` in the tool registry) is checked against that tool's policy for the team."""
    tools = all_tools()

    def check(tool: str, params: dict) -> Iterator[tuple[tuple, str]]:
        registered = tools.get(tool)
        if registered is None or not registered.url_params:
            return
        urls = [(name, params[name]) for name in registered.url_params
                if isinstance(params.get(name), str)]
        try:
            policy = policy_for(tool=tool, team=team)
        except ImproperlyConfigured as error:
            # Fail closed, as every call would: nothing can be checked against a broken policy.
            for name, _ in urls:
                yield (name,), f"cannot be checked: the egress policy setting is malformed: {error}"
            return
        for name, value in urls:
            for message in url_problems(value, policy):
                yield (name,), message

    return check


def _refused(text: str, reason: str) -> str:
    return f"egress policy refuses {text!r}: {reason}"


def _host_end(partial: str) -> int | None:
    """Where a host followed by `:` ends in a partial authority, or None if it does not."""
    if partial.startswith("["):
        end = partial.find("]:")
        return end + 1 if end > 0 else None
    # An empty host before the `:` is found too, so that it is refused as `http://:80/` is.
    end = partial.find(":")
    return end if end >= 0 else None


def _host_port(authority: str) -> tuple[str, int | None] | None:
    if authority.startswith("["):
        host, bracket, tail = authority[1:].partition("]")
        if not bracket or (tail and not tail.startswith(":")):
            return None
        port_text = tail[1:]
    else:
        host, _, port_text = authority.partition(":")
    if not host:
        return None
    if not port_text:
        return host.rstrip(".").lower(), None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None
    return host.rstrip(".").lower(), int(port_text)
