"""The websocket consumers: who may listen, and the re-read a (re)connecting page is told to do.

Driven through the real ASGI application (session auth, URL routing, origin check) with
`channels.testing.WebsocketCommunicator`; the database is transactional because the consumer
reads it from another thread.
"""
import pytest
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.utils.module_loading import import_string

from orchestrator.asgi import application
from orchestrator.engine.services.runs import run_cancel, run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, Role, TeamMembership
from orchestrator.web.live.consumers import REFUSED
from orchestrator.web.live.groups import run_group
from tests.factories import SETUP, TeamFactory, member

from .conftest import GATED, run_async

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_relay(settings):
    """These tests drive the consumers alone, each call on an event loop of its own that closes
    after it; the relay (tests/live/test_relay*.py) would be started on, and cancelled with,
    every one of those loops - on PostgreSQL inside its LISTEN wait."""
    settings.STEPWISE_LIVE_RELAY = False


def session_cookie(user) -> str:
    """A signed-in session for `user`, as the admin's login would leave it."""
    store = import_string(f"{settings.SESSION_ENGINE}.SessionStore")()
    store[SESSION_KEY] = str(user.pk)
    store[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    store[HASH_SESSION_KEY] = user.get_session_auth_hash()
    store.save()
    return f"{settings.SESSION_COOKIE_NAME}={store.session_key}"


def headers_for(user=None) -> list[tuple[bytes, bytes]]:
    headers = [(b"origin", b"http://localhost"), (b"host", b"localhost")]
    if user is not None:
        headers.append((b"cookie", session_cookie(user).encode()))
    return headers


async def _connect(path: str, headers):
    ws = WebsocketCommunicator(application, path, headers=headers)
    connected, code = await ws.connect(timeout=30)
    first = await ws.receive_json_from(timeout=30) if connected else None
    await ws.disconnect()
    return connected, code, first


def connect_once(path: str, user=None):
    """(accepted, close code, the first message) of one connection."""
    return run_async(_connect, path, headers_for(user))


@pytest.fixture
def run(team):
    version, _ = workflow_save(team=team, definition=GATED, actor=SETUP)
    return run_start(version=version, input={}, actor=member(team, "starter", role=Role.EDITOR))


def newest_event(run) -> int:
    return Event.objects.filter(run=run).order_by("-id").values_list("id", flat=True).first()


def test_a_member_of_the_runs_team_is_told_to_read_the_newest_state_on_connect(run, team):
    viewer = member(team, "viewer", role=Role.MEMBER)
    accepted, _, first = connect_once(f"/ws/runs/{run.id}/", viewer)
    assert accepted
    assert first == {"type": "changed", "event": newest_event(run)}


@pytest.mark.parametrize("who", ["anonymous", "outsider", "inactive member"])
def test_a_websocket_of_someone_who_may_not_see_the_run_is_refused(run, team, who):
    user = {"anonymous": lambda: None,
            "outsider": lambda: member(TeamFactory(slug="other"), "outsider"),
            "inactive member": lambda: _inactive(member(team, "gone", role=Role.OWNER))}[who]()
    accepted, code, _ = connect_once(f"/ws/runs/{run.id}/", user)
    assert not accepted
    assert code == REFUSED


def _inactive(user):
    user.is_active = False
    user.save()
    return user


def test_the_run_list_socket_is_refused_to_anonymous_users_and_users_of_no_team(db):
    assert connect_once("/ws/runs/")[0] is False
    loner = member(TeamFactory(slug="empty"), "loner")
    TeamMembership.objects.filter(user=loner).delete()
    assert connect_once("/ws/runs/", loner)[0] is False


def test_a_page_that_reconnects_is_told_about_what_it_missed(run, team):
    viewer = member(team, "viewer", role=Role.MEMBER)
    _, _, first = connect_once(f"/ws/runs/{run.id}/", viewer)
    run_cancel(run_id=run.id, actor=SETUP)  # committed while the page was away
    _, _, again = connect_once(f"/ws/runs/{run.id}/", viewer)
    assert again["event"] == newest_event(run) > first["event"]


async def _nudged(path: str, headers, run_id) -> dict:
    ws = WebsocketCommunicator(application, path, headers=headers)
    await ws.connect(timeout=30)
    await ws.receive_json_from(timeout=30)
    await get_channel_layer().group_send(run_group(run_id), {"type": "run.changed", "run": str(run_id),
                                                             "event": 123})
    message = await ws.receive_json_from(timeout=30)
    await ws.disconnect()
    return message


def test_a_nudge_to_the_runs_group_reaches_its_page(run, team):
    viewer = member(team, "viewer", role=Role.MEMBER)
    message = run_async(_nudged, f"/ws/runs/{run.id}/", headers_for(viewer), run.id)
    assert message == {"type": "changed", "run": str(run.id), "event": 123}
