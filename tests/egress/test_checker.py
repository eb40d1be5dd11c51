"""The save-time checker a definition's validator calls for each tool call
(`definition_checker`, from the mutation survivors of orchestrator/integrations/egress/static.py)."""

from orchestrator.integrations.egress import definition_checker


def test_a_tool_the_registry_does_not_know_is_left_to_the_validators_own_problem(settings):
    settings.STEPWISE_EGRESS = {}
    check = definition_checker(team="")
    assert list(check("no.such.tool", {"url": "http://10.0.0.1/"})) == []
    assert [path for path, _ in check("http.request", {"url": "http://10.0.0.1/"})] == [("url",)]
