"""Alerts in the admin: a team's operators and owners acknowledge and resolve them through
`alerts.services` (permission `alert.handle`); members only see them; other teams see nothing."""
import pytest
from django.test import Client

from alerts.models import Alert, AlertState
from alerts.services import alert_acknowledge, alert_raise, alert_resolve
from orchestrator.engine.errors import Forbidden, NotAllowed
from orchestrator.models import Role
from tests.factories import TeamFactory, member

pytestmark = pytest.mark.django_db


@pytest.fixture
def alert(team):
    return alert_raise("run.failed", team=team, key="run.failed:test", subject="Run x failed",
                       body="It failed.")


def admin_post(user, action, alert):
    client = Client()
    client.force_login(user)
    return client.post("/admin/alerts/alert/", {"action": action, "_selected_action": [alert.id]})


def test_an_operator_acknowledges_then_resolves_in_the_admin(team, operator, alert):
    admin_post(operator, "acknowledge", alert)
    alert.refresh_from_db()
    assert (alert.state, alert.acknowledged_by) == (AlertState.ACKNOWLEDGED, operator)
    admin_post(operator, "resolve", alert)
    alert.refresh_from_db()
    assert (alert.state, alert.resolved_by) == (AlertState.RESOLVED, operator)
    with pytest.raises(NotAllowed):
        alert_acknowledge(alert_id=alert.id, actor=operator)


def test_a_member_sees_the_alert_and_may_not_handle_it(team, alert):
    viewer = member(team, "viewer", role=Role.MEMBER, staff=True)
    client = Client()
    client.force_login(viewer)
    assert "Run x failed" in client.get("/admin/alerts/alert/").content.decode()
    admin_post(viewer, "resolve", alert)
    assert Alert.objects.get(pk=alert.pk).state == AlertState.OPEN
    with pytest.raises(Forbidden):
        alert_resolve(alert_id=alert.id, actor=viewer)


def test_another_teams_operator_sees_nothing(team, alert):
    stranger = member(TeamFactory(slug="far"), "stranger", role=Role.OPERATOR, staff=True)
    client = Client()
    client.force_login(stranger)
    assert "Run x failed" not in client.get("/admin/alerts/alert/").content.decode()
    with pytest.raises(Forbidden):
        alert_resolve(alert_id=alert.id, actor=stranger)
