import copy

import pytest
import yaml

from orchestrator.models import Role, Workflow, WorkflowVersion
from tests.conftest import client_for, member
from tests.factories import EXAMPLES, TeamFactory, example_definition

BROKEN = {
    "name": "broken",
    "input_schema": {"type": "object"},
    "steps": [
        {"name": "a", "type": "tool", "tool": "core.echo", "after": ["b"]},
        {"name": "b", "type": "tool", "tool": "core.echo", "after": ["a"]},
        {"name": "c", "type": "tool", "tool": "core.echo", "after": ["nope"], "when": "input.x +"},
    ],
}


def save(client, body, **kwargs):
    return client.post("/api/v1/workflows/", body, format="json", **kwargs)


@pytest.mark.django_db
def test_saving_a_new_definition_creates_version_1(api):
    response = save(api, example_definition("support"))

    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["workflow"], body["team"], body["number"], body["created"]) == (
        "support-reply", "support", 1, True)
    assert body["definition"]["name"] == "support-reply"


@pytest.mark.django_db
def test_saving_the_same_definition_again_is_200_and_unchanged(api):
    save(api, example_definition("support"))

    response = save(api, {"definition": example_definition("support")})

    assert response.status_code == 200
    assert (response.json()["number"], response.json()["created"]) == (1, False)
    assert WorkflowVersion.objects.count() == 1


@pytest.mark.django_db
def test_saving_a_changed_definition_creates_the_next_version(api):
    save(api, example_definition("support"))
    changed = example_definition("support")
    changed["description"] = "Now with a new description."

    response = save(api, changed)

    assert response.status_code == 201
    assert response.json()["number"] == 2


@pytest.mark.django_db
def test_invalid_definition_lists_every_problem_with_its_path(api):
    response = save(api, BROKEN)

    assert response.status_code == 400
    errors = response.json()["errors"]
    paths = {e["path"] for e in errors}
    assert {"steps[0].after", "steps[2].after[0]", "steps[2].when"} <= paths
    messages = " ".join(e["message"] for e in errors)
    assert "cycle" in messages and "nope" in messages and "CEL" in messages
    assert not Workflow.objects.exists()


@pytest.mark.django_db
def test_a_fallback_that_waits_for_its_primary_is_refused_before_any_run_deadlocks(api):
    definition = {
        "name": "stuck-fallback",
        "input_schema": {"type": "object"},
        "steps": [
            {"name": "a", "type": "tool", "tool": "core.echo", "fallback": "fb"},
            {"name": "b", "type": "tool", "tool": "core.echo", "after": ["a"]},
            {"name": "fb", "type": "tool", "tool": "core.echo", "after": ["b"]},
        ],
    }

    response = save(api, definition)

    assert response.status_code == 400
    assert response.json()["errors"] == [{
        "path": "steps[0].fallback",
        "message": "fallback 'fb' depends on its primary 'a' (fb -> b -> a), so it could never run",
    }]
    assert not Workflow.objects.exists()


@pytest.mark.django_db
def test_yaml_body_is_accepted(api):
    text = (EXAMPLES / "support.yaml").read_text()

    response = api.generic("POST", "/api/v1/workflows/", text, content_type="application/yaml")

    assert response.status_code == 201, response.json()
    assert response.json()["workflow"] == "support-reply"


@pytest.mark.django_db
def test_text_yaml_body_is_accepted(api):
    text = yaml.safe_dump(example_definition("lead-routing"))

    response = api.generic("POST", "/api/v1/workflows/", text, content_type="text/yaml")

    assert response.status_code == 201, response.json()


@pytest.mark.django_db
def test_unparsable_yaml_is_a_400_with_errors(api):
    response = api.generic("POST", "/api/v1/workflows/", "name: [unclosed",
                           content_type="application/yaml")

    assert response.status_code == 400
    assert response.json()["errors"][0]["message"].startswith("invalid YAML")


@pytest.mark.django_db
def test_validate_reports_valid_and_saves_nothing(api):
    response = api.post("/api/v1/workflows/validate/", example_definition("support"), format="json")

    assert response.status_code == 200
    assert response.json() == {"valid": True, "errors": []}
    assert not Workflow.objects.exists()


@pytest.mark.django_db
def test_validate_lists_every_problem(api):
    response = api.post("/api/v1/workflows/validate/", {"definition": BROKEN}, format="json")

    assert response.status_code == 400
    assert response.json()["valid"] is False
    assert len(response.json()["errors"]) >= 3


@pytest.mark.django_db
def test_validate_accepts_yaml(api):
    text = (EXAMPLES / "support.yaml").read_text()

    response = api.generic("POST", "/api/v1/workflows/validate/", text,
                           content_type="application/yaml")

    assert response.json() == {"valid": True, "errors": []}


@pytest.mark.django_db
def test_user_of_several_teams_must_name_the_team(api, requester):
    TeamFactory(slug="sales").members.add(requester, through_defaults={"role": "editor"})

    ambiguous = save(api, example_definition("support"))
    chosen = save(api, {"definition": example_definition("support"), "team": "sales"})

    assert ambiguous.status_code == 400
    assert ambiguous.json()["errors"][0]["path"] == "team"
    assert chosen.status_code == 201
    assert chosen.json()["team"] == "sales"


@pytest.mark.django_db
def test_saving_to_a_team_you_are_not_in_is_a_400(api, outsider):
    response = save(api, {"definition": example_definition("support"), "team": "other"})

    assert response.status_code == 400
    assert "not a member" in response.json()["errors"][0]["message"]


@pytest.mark.django_db
def test_list_and_detail_show_the_latest_version(api):
    save(api, example_definition("support"))
    changed = example_definition("support")
    changed["description"] = "v2"
    save(api, changed)

    listed = api.get("/api/v1/workflows/").json()["results"]
    detail = api.get("/api/v1/workflows/support-reply/").json()

    assert [(w["name"], w["latest_version"]) for w in listed] == [("support-reply", 2)]
    assert (detail["version"], detail["team"], detail["definition"]["description"]) == (
        2, "support", "v2")
    assert [v["number"] for v in detail["versions"]] == [2, 1]


@pytest.mark.django_db
def test_versions_list_and_version_detail(api):
    save(api, example_definition("support"))
    changed = example_definition("support")
    changed["description"] = "v2"
    save(api, changed)

    versions = api.get("/api/v1/workflows/support-reply/versions/").json()["results"]
    first = api.get(versions[-1]["url"]).json()
    missing = api.get("/api/v1/workflows/support-reply/versions/9/")

    assert [v["number"] for v in versions] == [2, 1]
    assert first["number"] == 1
    assert first["definition"]["description"] == example_definition("support")["description"]
    assert missing.status_code == 404


@pytest.mark.django_db
def test_same_name_in_two_of_your_teams_needs_team_parameter(api, requester):
    sales = TeamFactory(slug="sales")
    sales.members.add(requester, through_defaults={"role": "editor"})
    save(api, {"definition": example_definition("support"), "team": "support"})
    other = copy.deepcopy(example_definition("support"))
    other["description"] = "sales copy"
    save(api, {"definition": other, "team": "sales"})

    ambiguous = api.get("/api/v1/workflows/support-reply/")
    chosen = api.get("/api/v1/workflows/support-reply/?team=sales")

    assert ambiguous.status_code == 400
    assert "?team=" in ambiguous.json()["errors"][0]["message"]
    assert chosen.json()["definition"]["description"] == "sales copy"


@pytest.mark.django_db
def test_outsider_sees_no_workflow_of_another_team(api, outsider_api):
    save(api, example_definition("support"))

    assert outsider_api.get("/api/v1/workflows/").json()["results"] == []
    assert outsider_api.get("/api/v1/workflows/support-reply/").status_code == 404
    assert outsider_api.get("/api/v1/workflows/support-reply/versions/").status_code == 404
    assert outsider_api.post("/api/v1/workflows/support-reply/runs/", {"input": {}},
                             format="json").status_code == 404


@pytest.mark.django_db
def test_staff_sees_nothing_of_teams_they_are_not_in(outsider_api, operator):
    save(outsider_api, example_definition("support"))

    listed = client_for(operator).get("/api/v1/workflows/").json()["results"]

    assert operator.is_staff and listed == []


@pytest.mark.django_db
@pytest.mark.parametrize("value", [0, 1, "yes", "false", None])
def test_the_publishing_policy_takes_a_json_boolean_only(team, value):
    owner = member(team, "policy-owner", role=Role.OWNER)
    owner_api = client_for(owner)
    save(owner_api, example_definition("support"))

    response = owner_api.post("/api/v1/workflows/support-reply/policy/",
                              {"publish_on_save": value}, format="json")

    assert response.status_code == 400
    assert [e["path"] for e in response.json()["errors"]] == ["publish_on_save"]
    assert Workflow.objects.get(name="support-reply").publish_on_save is True
