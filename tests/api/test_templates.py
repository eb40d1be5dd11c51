"""`/api/v1/templates/`: the gallery, one template's definition, and starting a workflow from
one — as the caller, who needs workflow.save in the team; every answer as the schema says."""
import pytest

from orchestrator.engine.gallery import templates
from orchestrator.models import WorkflowVersion
from tests.conftest import client_for
from tests.factories import member

from .published import assert_documented

pytestmark = pytest.mark.django_db
NAMES = {"support-reply", "document-processing", "content-moderation", "incident-alert",
         "revise-until-approved", "missing-field", "order-payment"}


def test_the_gallery_lists_every_template_with_a_sample_input(api):
    response = api.get("/api/v1/templates/")
    assert_documented(api, response, "GET", "/api/v1/templates/")
    body = {t["name"]: t for t in response.json()}
    assert set(body) == NAMES
    assert body["incident-alert"]["trigger"]["kind"] == "webhook"
    assert body["content-moderation"]["trigger"] is None
    assert all(t["sample_input"] and t["summary"] for t in body.values())


def test_a_template_shows_the_definition_it_saves(api):
    response = api.get("/api/v1/templates/revise-until-approved/")
    assert_documented(api, response, "GET", "/api/v1/templates/{name}/")
    assert response.json()["definition"]["steps"][0]["type"] == "loop"
    missing = api.get("/api/v1/templates/nothing/")
    assert_documented(api, missing, "GET", "/api/v1/templates/{name}/")
    assert missing.status_code == 404 and missing.json()["errors"][0]["path"] == "name"


def test_instantiating_saves_the_workflow_in_the_callers_team(api, team):
    url = "/api/v1/templates/content-moderation/instantiate/"
    response = api.post(url, {}, format="json")
    assert_documented(api, response, "POST", "/api/v1/templates/{name}/instantiate/")
    assert response.status_code == 201 and response.json()["workflow"] == "content-moderation"
    again = api.post(url, {}, format="json")
    assert again.status_code == 200 and again.json()["created"] is False
    renamed = api.post(url, {"name": "forum-moderation"}, format="json")
    assert renamed.status_code == 201
    assert WorkflowVersion.objects.get(workflow__name="forum-moderation").workflow.team == team


def test_instantiating_needs_workflow_save_and_a_valid_name(api, team):
    viewer = client_for(member(team, "viewer", role="member"))
    url = "/api/v1/templates/incident-alert/instantiate/"
    refused = viewer.post(url, {}, format="json")
    assert_documented(viewer, refused, "POST", "/api/v1/templates/{name}/instantiate/")
    assert refused.status_code == 403
    bad = api.post(url, {"name": "Not A Name"}, format="json")
    assert_documented(api, bad, "POST", "/api/v1/templates/{name}/instantiate/")
    assert bad.status_code == 400 and bad.json()["errors"][0]["path"] == "name"
    missing = api.post("/api/v1/templates/nothing/instantiate/", {}, format="json")
    assert missing.status_code == 404
    assert not WorkflowVersion.objects.exists()


@pytest.mark.parametrize("template", templates(), ids=lambda t: t.name)
def test_every_template_saves_and_its_sample_input_is_valid(team, requester, template):
    from orchestrator.engine.services.gallery import template_instantiate
    from orchestrator.engine.services.runs import run_start

    version, created = template_instantiate(template=template.name, team=team, actor=requester)
    assert created and version.workflow.name == template.name
    run = run_start(version=version, input=template.sample_input, actor=requester)
    assert run.state in ("running", "waiting")
