"""The admin offers a person only the pages that open for them: no link answers 403."""
import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role
from tests.factories import SETUP, example_definition, member

pytestmark = pytest.mark.django_db
BUILDER, GALLERY = "/admin/orchestrator/workflow/builder/", "/admin/orchestrator/workflow/from-template/"


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_member_is_not_offered_the_builder_the_gallery_or_an_inbox_they_cannot_open(team):
    workflow_save(team=team, definition=example_definition("support"), actor=SETUP)
    viewer = signed_in(member(team, "mia_member", role=Role.MEMBER, staff=True))
    html = viewer.get("/admin/orchestrator/workflow/").content.decode()

    assert BUILDER not in html and GALLERY not in html and "open in builder" not in html
    assert viewer.get(BUILDER).status_code == 403
    assert "/admin/approvals/approvalrequest/" not in html  # not a reviewer: no inbox
    assert viewer.get("/admin/approvals/approvalrequest/").status_code == 403
    editor = signed_in(member(team, "eddie", role=Role.EDITOR, staff=True))
    assert BUILDER in editor.get("/admin/orchestrator/workflow/").content.decode()


def test_an_auditor_in_no_team_is_not_offered_the_operations_pages(db):
    auditor = User.objects.create_user("audra", is_staff=True)
    auditor.groups.add(Group.objects.get_or_create(name="auditors")[0])
    client = signed_in(auditor)
    html = client.get("/admin/").content.decode()

    assert "/admin/orchestrator/run/operations/" not in html
    assert "/admin/orchestrator/deadletter/" not in html
    assert client.get("/admin/orchestrator/deadletter/").status_code == 403
