"""The admin's "new workflow from template" page: the gallery, and a form per template that
saves its workflow through `template_instantiate` (workflow.save checked there, not here)."""
import pytest
from django.urls import reverse

from orchestrator.engine.gallery import templates
from orchestrator.models import Workflow, WorkflowVersion
from tests.factories import member

pytestmark = pytest.mark.django_db
URL = "/admin/orchestrator/workflow/from-template/"


@pytest.fixture
def editor(client, team):
    client.force_login(member(team, "editor", role="editor", staff=True))
    return client


def test_the_workflow_list_links_to_the_gallery_which_shows_every_template(editor):
    assert URL in editor.get("/admin/orchestrator/workflow/").content.decode()
    page = editor.get(URL).content.decode()
    for template in templates():
        assert template.title in page and f'value="{template.name}"' in page


def test_every_template_starts_a_workflow_from_the_admin(editor, team):
    for template in templates():
        response = editor.post(URL, {"template": template.name, "team": team.id, "name": ""})
        workflow = Workflow.objects.get(name=template.name, team=team)
        assert response.status_code == 302
        assert response.url == reverse("admin:orchestrator_workflow_change", args=[workflow.id])
    assert WorkflowVersion.objects.count() == len(templates())


def test_a_chosen_name_is_used_and_a_bad_one_is_shown_on_the_page(editor, team):
    editor.post(URL, {"template": "incident-alert", "team": team.id, "name": "pager-duty"})
    assert Workflow.objects.filter(name="pager-duty").exists()
    response = editor.post(URL, {"template": "incident-alert", "team": team.id, "name": "Bad Name"})
    assert response.status_code == 400 and "errorlist" in response.content.decode()


def test_a_member_who_may_not_save_sees_the_gallery_without_forms_and_cannot_post(client, team):
    client.force_login(member(team, "watcher", role="member", staff=True))
    page = client.get(URL).content.decode()
    assert "You may not save workflows" in page and "Create workflow" not in page
    response = client.post(URL, {"template": "incident-alert", "team": team.id})
    assert response.status_code == 400 and not Workflow.objects.exists()
