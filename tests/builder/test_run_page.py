"""Run... on a workflow's page: the published version, started with an input the person edits,
offered as the template's sample input when the workflow was made from one (under any name)."""
import json

import pytest
from django.test import Client

from orchestrator.engine.gallery import template_named
from orchestrator.engine.services.gallery import template_instantiate
from orchestrator.models import Role, Run
from tests.factories import member

pytestmark = pytest.mark.django_db


@pytest.fixture
def editor(team):
    return member(team, "editor", role=Role.EDITOR, staff=True)


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_workflow_made_from_a_template_offers_run_with_its_sample_input(team, editor):
    version, _ = template_instantiate(template="content-moderation", team=team, actor=editor,
                                      name="our-moderation")
    workflow = version.workflow
    client = signed_in(editor)

    page = client.get(f"/admin/orchestrator/workflow/{workflow.id}/change/").content.decode()
    assert f'href="/admin/orchestrator/workflow/{workflow.id}/run/"' in page  # Run...
    assert f'href="/admin/orchestrator/workflow/{workflow.id}/builder/"' in page  # the builder
    form = client.get(f"/admin/orchestrator/workflow/{workflow.id}/run/")
    offered = json.loads(form.context["input_text"])
    assert offered == template_named("content-moderation").sample_input

    response = client.post(f"/admin/orchestrator/workflow/{workflow.id}/run/",
                           {"input": json.dumps(offered)})

    run = Run.objects.get(version__workflow=workflow)
    assert response.status_code == 302
    assert response["Location"] == f"/admin/orchestrator/run/{run.id}/live/"
    assert run.input == offered and run.created_by == editor and run.trigger == "admin"


def test_the_builder_offers_the_template_sample_input_for_a_renamed_workflow(team, editor):
    version, _ = template_instantiate(template="support-reply", team=team, actor=editor,
                                      name="our-support")
    page = signed_in(editor).get(f"/admin/orchestrator/workflow/{version.workflow_id}/builder/")
    assert page.context["data"]["sample_input"] == template_named("support-reply").sample_input


def test_an_input_the_schema_refuses_comes_back_on_the_form_with_its_path(team, editor):
    version, _ = template_instantiate(template="support-reply", team=team, actor=editor)

    response = signed_in(editor).post(f"/admin/orchestrator/workflow/{version.workflow_id}/run/",
                                      {"input": json.dumps({"ticket_id": "T-1"})})

    assert response.status_code == 400
    html = response.content.decode()
    assert "run-problems" in html and "body" in html
    assert not Run.objects.exists()


def test_a_person_of_another_team_finds_no_such_page(team, editor, outsider):
    version, _ = template_instantiate(template="support-reply", team=team, actor=editor)
    outsider.is_staff = True
    outsider.save()

    response = signed_in(outsider).post(f"/admin/orchestrator/workflow/{version.workflow_id}/run/",
                                        {"input": json.dumps(template_named("support-reply").sample_input)})

    assert response.status_code == 404 and not Run.objects.exists()
