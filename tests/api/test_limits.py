"""Limits through the API (issue 10): every oversized or costly input is a 4xx with a path in
the one error shape, answered quickly; never a 500, a stall or a stuck run."""
import json

import pytest

from orchestrator.engine.definitions import limits
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Run, Workflow
from tests.definitions.test_limits import NESTED_ALL, yaml_bomb
from tests.factories import example_definition

WORKFLOWS = "/api/v1/workflows/"
RUNS = "/api/v1/workflows/support-reply/runs/"


def definition(**step_fields) -> dict:
    step = {"name": "a", "type": "tool", "tool": "core.echo", **step_fields}
    return {"name": "limits", "input_schema": {"type": "object"}, "steps": [step]}


def post_json(client, url, text: str):
    return client.generic("POST", url, text, content_type="application/json")


def assert_refused(response, path: str, *, status: int = 400):
    """Refused with a 4xx naming `path` (a limit refuses before the work; how long that takes
    is a figure for bench/, not an assertion here)."""
    assert response.status_code == status, response.content[:500]
    errors = response.json()["errors"]
    assert errors and all(set(e) == {"path", "message"} for e in errors)
    assert path in {e["path"] for e in errors}, errors


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "path"),
    [
        (definition(params={"x": "{{ 10**10000000 }}"}), "steps[0].params.x"),
        (definition(params={"x": "{{ 'a' * 300000000 }}"}), "steps[0].params.x"),
        (definition(when=NESTED_ALL), "steps[0].when"),
        (definition(timeout_s=10**30), "steps[0].timeout_s"),
        ({**definition(), "budget": {"max_duration_s": 1e30}}, "budget.max_duration_s"),
        ({**definition(), "steps": [{"name": f"s{i}", "type": "tool", "tool": "core.echo",
                                    **({"after": [f"s{i - 1}"]} if i else {})} for i in range(3000)]},
         "steps"),
    ],
    ids=["power", "repeat", "nested-all", "timeout", "max-duration", "3000-steps"],
)
def test_saving_a_costly_or_oversized_definition_is_a_400_with_its_path(api, body, path):
    response = api.post(WORKFLOWS, body, format="json")

    assert_refused(response, path)
    assert not Workflow.objects.exists()


@pytest.mark.django_db
def test_a_yaml_alias_bomb_is_a_400(api):
    response = api.generic("POST", WORKFLOWS, yaml_bomb(), content_type="application/yaml")

    assert_refused(response, "")
    assert "aliases" in response.json()["errors"][0]["message"]


@pytest.mark.django_db
def test_json_nested_10000_levels_is_a_400_not_a_recursion_error(api):
    body = '{"name": "x", "input_schema": {"type": "object"}, "steps": ' + "[" * 10000 + "]" * 10000 + "}"

    response = post_json(api, WORKFLOWS, body)

    assert_refused(response, "")


@pytest.mark.django_db
def test_a_body_over_the_request_limit_is_a_413_in_the_error_shape(api, settings):
    settings.STEPWISE_MAX_REQUEST_BYTES = 1000
    body = json.dumps({**definition(), "description": "x" * 2000})

    for response in (post_json(api, WORKFLOWS, body),
                     api.generic("POST", WORKFLOWS, body, content_type="application/yaml")):
        assert_refused(response, "", status=413)
        assert "STEPWISE_MAX_REQUEST_BYTES" in response.json()["errors"][0]["message"]


@pytest.fixture
def support(team, requester):
    version, _ = workflow_save(team=team, definition=example_definition("support"), actor=requester)
    return version


@pytest.mark.django_db
def test_run_input_nested_too_deeply_is_a_400_and_creates_no_run(api, support):
    deep: object = "x"
    for _ in range(limits.MAX_INPUT_DEPTH + 5):
        deep = {"d": deep}

    response = api.post(RUNS, {"input": {"ticket_id": "T", "body": "b", "customer_email": "e",
                                         "deep": deep}}, format="json")

    assert_refused(response, "input.deep" + ".d" * (limits.MAX_INPUT_DEPTH - 1))
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_run_input_over_the_size_limit_is_a_400(api, support):
    body = {"input": {"ticket_id": "T", "body": "b" * (limits.MAX_INPUT_BYTES + 1),
                      "customer_email": "e"}}

    response = api.post(RUNS, body, format="json")

    assert_refused(response, "input")
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_run_input_with_nan_is_a_400(api, support):
    body = '{"input": {"ticket_id": "T", "body": NaN, "customer_email": "e"}}'

    response = post_json(api, RUNS, body)

    assert_refused(response, "")
    assert not Run.objects.exists()
