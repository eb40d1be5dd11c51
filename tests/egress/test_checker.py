"""The save-time check (from the mutation survivors of orchestrator/integrations/egress/static.py):
the checker a definition's validator calls for each tool call, and a URL whose empty host is
literal."""

import pytest

from orchestrator.integrations.egress import Policy, definition_checker, url_problems


def test_a_tool_the_registry_does_not_know_is_left_to_the_validators_own_problem(settings):
    settings.STEPWISE_EGRESS = {}
    check = definition_checker(team="")
    assert list(check("no.such.tool", {"url": "http://10.0.0.1/"})) == []
    assert [path for path, _ in check("http.request", {"url": "http://10.0.0.1/"})] == [("url",)]


@pytest.mark.parametrize("text", ["http://:80/", "http://:{{ input.port }}/"])
def test_an_empty_host_is_refused_whether_its_port_is_literal_or_templated(text):
    assert url_problems(text, Policy()) == [f"egress policy refuses {text!r}: it has no valid host"]
