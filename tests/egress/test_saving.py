"""The egress policy when a definition is saved: a literal URL (or the literal scheme and host
in front of a template) that the policy refuses is a 400 with the param's path."""
import pytest

from orchestrator.engine.definitions import DefinitionInvalid
from orchestrator.engine.services.workflows import workflow_save
from tests.factories import SETUP, TeamFactory

pytestmark = pytest.mark.django_db


def definition(params: dict, **step) -> dict:
    return {"name": "fetch", "input_schema": {"type": "object"},
            "steps": [{"name": "get", "type": "tool", "tool": "http.request", "params": params,
                       **step}]}


def save(api, body: dict):
    return api.post("/api/v1/workflows/", body, format="json")


@pytest.mark.parametrize("url, reason", [
    ("file:///etc/{{ input.name }}", "scheme 'file'"),
    ("gopher://127.0.0.1:6379/_{{ input.command }}", "scheme 'gopher'"),
    ("http://127.0.0.1:8000/api/v1/runs/", "loopback"),
    ("http://localhost:8000/api/v1/health/", "loopback"),
    ("http://2130706433/", "loopback"),
    ("http://0x7f000001/", "loopback"),
    ("http://127.1/", "loopback"),
    ("http://0.0.0.0/", "unspecified"),
    ("http://[::ffff:127.0.0.1]/", "loopback"),
    ("http://169.254.169.254/latest/meta-data/{{ input.path }}", "cloud metadata"),
    ("http://10.0.0.5:{{ input.port }}/", "private"),
    ("http://user@192.168.1.1/", "private"),
    ("https://api.example.com:6379/", "port 6379"),
])
def test_a_refused_url_is_a_400_with_the_params_path(api, settings, url, reason):
    settings.STEPWISE_EGRESS = {}
    # A template elsewhere in the params used to skip the URL check entirely.
    response = save(api, definition({"url": url, "headers": {"X-Trace": "{{ input.trace }}"}}))
    assert response.status_code == 400, response.json()
    errors = response.json()["errors"]
    assert [e["path"] for e in errors] == ["steps[0].params.url"], errors
    assert reason in errors[0]["message"] and "egress policy refuses" in errors[0]["message"]


@pytest.mark.parametrize("url", [
    "https://api.example.com/v1/{{ input.id }}",
    "https://{{ input.host }}/status",  # the host is decided at run time, and checked then
    "{{ input.url }}",
    "http://api.example.com",
])
def test_an_allowed_or_undecided_url_is_saved(api, settings, url):
    settings.STEPWISE_EGRESS = {}
    assert save(api, definition({"url": url})).status_code == 201


def test_compensations_and_map_items_are_checked_too(api, settings):
    settings.STEPWISE_EGRESS = {}
    body = {"name": "saga", "input_schema": {"type": "object"}, "steps": [
        {"name": "pay", "type": "tool", "tool": "http.request", "side_effect": True,
         "params": {"method": "POST", "url": "https://pay.example.com/charge"},
         "compensate": {"tool": "http.request",
                        "params": {"method": "POST", "url": "http://10.1.1.1/refund"}}},
        {"name": "each", "type": "map", "after": ["pay"], "over": "[1, 2]",
         "item": {"type": "tool", "tool": "http.request",
                  "params": {"url": "http://169.254.169.254/{{ item }}"}}},
    ]}
    response = save(api, body)
    assert response.status_code == 400
    assert sorted(e["path"] for e in response.json()["errors"]) == [
        "steps[0].compensate.params.url", "steps[1].item.params.url"]


def test_the_validate_endpoint_reports_the_same_problems(api, settings):
    settings.STEPWISE_EGRESS = {}
    response = api.post("/api/v1/workflows/validate/",
                        {"definition": definition({"url": "http://127.0.0.1/"})}, format="json")
    assert response.status_code == 400
    assert response.json()["valid"] is False
    assert response.json()["errors"][0]["path"] == "steps[0].params.url"


def test_a_teams_own_policy_decides_what_it_may_save(team, settings):
    settings.STEPWISE_EGRESS = {
        "teams": {team.slug: {"hosts": ["api.partner.example"]}},
        "tools": {"http.request": {"allow_networks": ["10.20.0.0/16"]}},
    }
    other = TeamFactory(slug="research")
    partner = definition({"url": "https://api.partner.example/orders"})
    elsewhere = definition({"url": "https://api.example.com/"})
    internal = definition({"url": "http://10.20.1.1/status"})
    workflow_save(team=team, definition=partner, actor=SETUP)
    with pytest.raises(DefinitionInvalid, match="not in the allowed hosts"):
        workflow_save(team=team, definition=elsewhere, actor=SETUP)
    workflow_save(team=other, definition=elsewhere, actor=SETUP)
    workflow_save(team=other, definition=internal, actor=SETUP)  # the tool's layer allows 10.20.0.0/16


def test_url_problems_reads_only_the_literal_prefix():
    from orchestrator.integrations.egress import DEFAULT_POLICY, Policy, url_problems

    assert url_problems("https://api.example.com/{{ x }}", DEFAULT_POLICY) == []
    assert url_problems("http{{ s }}://127.0.0.1/", DEFAULT_POLICY) == []
    assert url_problems("http://api.{{ domain }}/", DEFAULT_POLICY) == []
    assert url_problems("http://10.0.0.{{ n }}/", DEFAULT_POLICY) == []
    assert url_problems("http://u:{{ pw }}@10.0.0.1/", DEFAULT_POLICY) == []  # ambiguous: run time
    assert url_problems("http://127.0.0.1:{{ port }}/", Policy(ports=None))
    assert url_problems("http://127.0.0.1:{% if a %}80{% endif %}/", Policy(ports=None))
    assert url_problems("http://[::1]:{{ port }}/", Policy(ports=None))
    assert url_problems("http://127.0.0.1:99999/", Policy(ports=None)) == [
        "egress policy refuses 'http://127.0.0.1:99999/': it has no valid host"]


def test_a_malformed_policy_setting_refuses_urls_with_a_400_not_a_500(api, settings):
    settings.STEPWISE_EGRESS = {"default": {"ports": "all"}}
    response = save(api, definition({"url": "https://api.example.com/"}))
    assert response.status_code == 400
    assert "egress policy setting is malformed" in response.json()["errors"][0]["message"]
