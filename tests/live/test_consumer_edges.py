"""The websocket consumers at their edges (from the mutation survivors of
orchestrator/web/live/consumers.py): the run list's socket for each kind of person, the team groups
it listens on, what a page is told on connect, and the groups a closed socket leaves."""
import pytest
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model

from orchestrator.asgi import application
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, Role
from orchestrator.web.live.consumers import REFUSED
from orchestrator.web.live.groups import ALL_RUNS, run_group, team_group
from orchestrator.web.live.relay import latest_event_id
from tests.factories import SETUP, TeamFactory, member

from .conftest import GATED, run_async
from .test_consumers import connect_once, headers_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_relay(settings):
    """The consumers alone, as in test_consumers.py: no relay on each call's own event loop."""
    settings.STEPWISE_LIVE_RELAY = False


@pytest.fixture
def run(team):
    version, _ = workflow_save(team=team, definition=GATED, actor=SETUP)
    return run_start(version=version, input={}, actor=member(team, "starter", role=Role.EDITOR))


async def _nudged_by(path: str, headers, groups: list[str]) -> list:
    """What one socket receives after a nudge to each of `groups` in turn.

    The last group must be one the socket listens to: a channel delivers in the order sent,
    so once its nudge arrives, every earlier nudge that was going to arrive has arrived."""
    ws = WebsocketCommunicator(application, path, headers=headers)
    connected, _ = await ws.connect(timeout=30)
    assert connected
    await ws.receive_json_from(timeout=30)
    for number, group in enumerate(groups, start=1):
        await get_channel_layer().group_send(group, {"type": "run.changed", "run": group,
                                                     "event": number})
    received = []
    while not received or received[-1]["event"] != len(groups):
        received.append(await ws.receive_json_from(timeout=30))
    await ws.disconnect()
    return received


def test_the_run_list_socket_tells_a_member_the_newest_event_at_once(run, team):
    viewer = member(team, "viewer", role=Role.MEMBER)
    accepted, _, first = connect_once("/ws/runs/", viewer)
    assert accepted
    assert first == {"type": "changed", "event": latest_event_id()} and first["event"] > 0


def test_the_run_list_listens_to_the_persons_teams_and_no_other(run, team):
    other = TeamFactory(slug="other")
    viewer = member(team, "viewer", role=Role.MEMBER)
    member(other, "viewer2")
    received = run_async(_nudged_by, "/ws/runs/", headers_for(viewer),
                         [team_group(other.id), ALL_RUNS, team_group(team.id)])
    assert received == [{"type": "changed", "run": team_group(team.id), "event": 3}]


def test_a_superusers_run_list_listens_to_every_team(run, team):
    root = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    received = run_async(_nudged_by, "/ws/runs/", headers_for(root),
                         [team_group(team.id), ALL_RUNS])
    assert received == [{"type": "changed", "run": ALL_RUNS, "event": 2}]


@pytest.mark.parametrize("who", ["anonymous", "inactive member", "inactive superuser",
                                 "member of no team"])
def test_the_run_list_socket_is_refused_with_its_code(team, who):
    person = None
    if who.startswith("inactive"):
        person = member(team, "gone", role=Role.OWNER)
        person.is_active, person.is_superuser = False, who == "inactive superuser"
        person.save()
    elif who == "member of no team":
        person = get_user_model().objects.create_user("loner")
    accepted, code, _ = connect_once("/ws/runs/", person)
    assert (accepted, code) == (False, REFUSED)


def test_a_run_without_events_is_announced_as_event_zero(run, team):
    Event.objects.filter(run=run).delete()
    viewer = member(team, "viewer", role=Role.MEMBER)
    assert connect_once(f"/ws/runs/{run.id}/", viewer)[2] == {"type": "changed", "event": 0}


async def _groups_after_close(path: str, headers, group: str) -> tuple[int, int]:
    layer = get_channel_layer()
    ws = WebsocketCommunicator(application, path, headers=headers)
    await ws.connect(timeout=30)
    await ws.receive_json_from(timeout=30)
    open_ = len(layer.groups.get(group, {}))
    await ws.disconnect()
    return open_, len(layer.groups.get(group, {}))


def test_a_closed_socket_leaves_the_groups_it_joined(run, team, settings):
    # A layer of this process's own, whose groups can be read (on any configured backend).
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    viewer = member(team, "viewer", role=Role.MEMBER)
    assert run_async(_groups_after_close, f"/ws/runs/{run.id}/", headers_for(viewer),
                     run_group(run.id)) == (1, 0)
    assert run_async(_groups_after_close, "/ws/runs/", headers_for(viewer),
                     team_group(team.id)) == (1, 0)
