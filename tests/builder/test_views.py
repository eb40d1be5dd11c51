"""The builder page and its layout endpoint: who may open it (whoever may save workflows in the
team: others get a 403, anonymous visitors the login page), what it is given (the version's
definition exactly as submitted, the format's schema, the saved positions), and where positions
are stored (beside the version: they change no definition, digest or version)."""
import json

import pytest

from orchestrator.engine.definitions.format import definition_format_schema
from orchestrator.engine.gallery import template_named
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role, TeamMembership, WorkflowVersion, WorkflowVersionLayout
from orchestrator.web.builder.views import integral_float_paths
from tests.factories import TeamFactory, example_definition, member

pytestmark = pytest.mark.django_db
NEW = "/admin/orchestrator/workflow/builder/"
LAYOUT = "/admin/orchestrator/workflow/builder/layout/"


def edit_url(workflow) -> str:
    return f"/admin/orchestrator/workflow/{workflow.id}/builder/"


def page_data(response) -> dict:
    html = response.content.decode()
    start = html.index('<script id="builder-data" type="application/json">') + len(
        '<script id="builder-data" type="application/json">')
    return json.loads(html[start:html.index("</script>", start)])


@pytest.fixture
def editor(team):
    return member(team, "editor", role=Role.EDITOR, staff=True)


@pytest.fixture
def viewer(team):
    """A member of the team (sees its workflows, starts runs) who may not save workflows."""
    return member(team, "viewer", role=Role.MEMBER, staff=True)


@pytest.fixture
def support(editor, team):
    version, _ = workflow_save(team=team, definition=example_definition("support"), actor=editor)
    return version


def test_anonymous_visitors_are_sent_to_the_login_page(client, support):
    for url in (NEW, edit_url(support.workflow), LAYOUT):
        response = client.get(url)
        assert response.status_code == 302 and response.url.startswith("/admin/login/")


def test_a_member_who_may_not_save_workflows_gets_403(client, viewer, support):
    client.force_login(viewer)
    assert client.get(edit_url(support.workflow)).status_code == 403
    assert client.get(NEW).status_code == 403
    assert client.get(f"{NEW}?team=support").status_code == 403


def test_an_editor_of_another_team_gets_403_for_this_team_and_never_sees_its_workflows(client, support):
    other = TeamFactory(slug="other", name="Other")
    client.force_login(member(other, "stranger", role=Role.EDITOR, staff=True))
    assert client.get(f"{NEW}?team=support").status_code == 403
    assert client.get(edit_url(support.workflow)).status_code == 404
    response = client.post(LAYOUT, json.dumps({"team": "support", "workflow": "support-reply", "number": 1,
                                               "positions": {}}), content_type="application/json")
    assert response.status_code == 404
    assert client.get(f"{NEW}?team=other").status_code == 200


def test_the_page_gets_the_version_exactly_as_saved_with_the_format_schema(client, editor, support):
    client.force_login(editor)
    response = client.get(edit_url(support.workflow))
    assert response.status_code == 200
    data = page_data(response)
    assert data["definition"] == support.definition
    assert data["schema"] == definition_format_schema()
    assert data["float_paths"] == [["budget", "max_cost_usd"]]  # 2.0 in examples/support.yaml
    assert (data["team"], data["workflow"], data["version"]) == ("support", "support-reply", 1)
    assert data["sample_input"] == template_named("support-reply").sample_input
    assert data["positions"] == {}


def test_an_older_version_and_a_template_can_be_opened(client, editor, team, support):
    changed = {**support.definition, "description": "v2"}
    workflow_save(team=team, definition=changed, actor=editor)
    client.force_login(editor)
    assert page_data(client.get(edit_url(support.workflow)))["definition"]["description"] == "v2"
    old = page_data(client.get(f"{edit_url(support.workflow)}?version=1"))
    assert old["version"] == 1 and old["definition"] == support.definition
    from_template = page_data(client.get(f"{NEW}?template=content-moderation&team=support"))
    assert from_template["definition"] == template_named("content-moderation").definition()
    assert from_template["template"] == "content-moderation" and from_template["version"] is None
    assert client.get(f"{NEW}?template=no-such-template").status_code == 404


def test_positions_are_stored_beside_the_version_and_change_nothing_of_its_definition(client, editor, support):
    client.force_login(editor)
    body = {"team": "support", "workflow": "support-reply", "number": 1,
            "positions": {"classify": {"x": 10, "y": 20.25}, "send": {"x": 400, "y": 20},
                          "not_a_step": {"x": 1, "y": 1}}}
    response = client.post(LAYOUT, json.dumps(body), content_type="application/json")
    assert response.status_code == 200
    assert response.json()["builder_url"] == f"{edit_url(support.workflow)}?version=1"
    layout = WorkflowVersionLayout.objects.get(version=support)
    assert layout.positions == {"classify": {"x": 10.0, "y": 20.2}, "send": {"x": 400.0, "y": 20.0}}
    assert layout.updated_by == editor
    support.refresh_from_db()
    assert support.definition == example_definition("support") and "positions" not in json.dumps(support.definition)
    assert WorkflowVersion.objects.filter(workflow=support.workflow).count() == 1
    assert page_data(client.get(edit_url(support.workflow)))["positions"] == layout.positions
    # Saving again replaces the positions.
    body["positions"] = {"draft": {"x": 5, "y": 6}}
    client.post(LAYOUT, json.dumps(body), content_type="application/json")
    assert WorkflowVersionLayout.objects.get(version=support).positions == {"draft": {"x": 5.0, "y": 6.0}}


def test_bad_positions_are_refused_with_their_path(client, editor, support):
    client.force_login(editor)
    for positions in ({"classify": {"x": "left", "y": 0}}, {"classify": {"x": 1}}, [1, 2],
                      {"classify": {"x": 1e9, "y": 0}}):
        response = client.post(LAYOUT, json.dumps({"team": "support", "workflow": "support-reply",
                                                   "number": 1, "positions": positions}),
                               content_type="application/json")
        assert response.status_code == 400, positions
        assert response.json()["errors"][0]["path"].startswith("positions")
    assert not WorkflowVersionLayout.objects.exists()
    assert client.post(LAYOUT, "not json", content_type="application/json").status_code == 400
    assert client.get(LAYOUT).status_code == 405


def test_a_layout_with_text_that_is_not_valid_unicode_is_refused(client, editor, support):
    client.force_login(editor)
    body = ('{"team": "support", "workflow": "support-reply", "number": 1, '
            '"positions": {"\\ud800": {"x": 1, "y": 2}}}')

    response = client.post(LAYOUT, body, content_type="application/json")

    assert response.status_code == 400
    assert not WorkflowVersionLayout.objects.exists()


def test_a_member_who_may_not_save_cannot_store_a_layout(client, viewer, support):
    client.force_login(viewer)
    response = client.post(LAYOUT, json.dumps({"team": "support", "workflow": "support-reply", "number": 1,
                                               "positions": {"classify": {"x": 1, "y": 2}}}),
                           content_type="application/json")
    assert response.status_code == 403
    assert not WorkflowVersionLayout.objects.exists()
    TeamMembership.objects.filter(user=viewer).update(role=Role.EDITOR)
    assert client.post(LAYOUT, json.dumps({"team": "support", "workflow": "support-reply", "number": 1,
                                           "positions": {"classify": {"x": 1, "y": 2}}}),
                       content_type="application/json").status_code == 200


def test_the_workflow_list_links_to_the_builder(client, editor, support):
    client.force_login(editor)
    html = client.get("/admin/orchestrator/workflow/").content.decode()
    assert NEW in html and edit_url(support.workflow) in html


def test_integral_floats_are_found_wherever_they_are():
    definition = {"budget": {"max_cost_usd": 2.0, "max_duration_s": 600},
                  "steps": [{"name": "a", "temperature": 0.5, "retry": {"base_s": 1.0}},
                            {"name": "b", "params": {"list": [1, 3.0, True]}}]}
    assert integral_float_paths(definition) == [
        ["budget", "max_cost_usd"], ["steps", 0, "retry", "base_s"], ["steps", 1, "params", "list", 1]]
