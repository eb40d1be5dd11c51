"""Websocket consumers: a run's page (`ws/runs/<id>/`) and the run list/operations page
(`ws/runs/`).

A consumer only decides who may listen and passes nudges on; it sends no state. On connect it
sends `{"type": "changed", "event": <newest event id>}` at once, so a page that (re)connects
re-reads the state it may have missed; each relayed nudge is the same message. Who may listen
is `authz.visible`, as for the API's reads: an anonymous user, or one who may not see the run,
is refused (closed with code 4403) before the handshake is accepted.
"""
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from orchestrator.engine.authz import teams_visible_to, visible
from orchestrator.models import Event, Run

from . import relay
from .groups import ALL_RUNS, run_group, team_group

REFUSED = 4403


class _Nudged(AsyncJsonWebsocketConsumer):
    groups_joined: list[str]

    async def _open(self, groups: list[str], newest: int) -> None:
        self.groups_joined = groups
        for group in groups:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        await self.send_json({"type": "changed", "event": newest})

    async def disconnect(self, code) -> None:
        for group in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive_json(self, content, **kwargs) -> None:
        pass  # the page only listens

    async def run_changed(self, message: dict) -> None:
        await self.send_json({"type": "changed", "run": message["run"], "event": message["event"]})


class RunConsumer(_Nudged):
    """Nudges for one run, to whoever may see it."""

    async def connect(self) -> None:
        run_id = self.scope["url_route"]["kwargs"]["run_id"]
        if not await database_sync_to_async(self._visible)(run_id):
            await self.close(code=REFUSED)
            return
        await relay.ensure_started()  # before the newest event is read: nothing falls between
        await self._open([run_group(run_id)], await database_sync_to_async(self._newest)(run_id))

    def _visible(self, run_id) -> bool:
        return visible(Run.objects.filter(id=run_id), self.scope["user"]).exists()

    @staticmethod
    def _newest(run_id) -> int:
        return Event.objects.filter(run_id=run_id).order_by("-id").values_list("id", flat=True).first() or 0


class RunListConsumer(_Nudged):
    """Nudges for every run of the teams the user may see (all teams for a superuser)."""

    async def connect(self) -> None:
        groups = await database_sync_to_async(self._groups)()
        if groups is None:
            await self.close(code=REFUSED)
            return
        await relay.ensure_started()  # before the newest event is read: nothing falls between
        await self._open(groups, await database_sync_to_async(relay.latest_event_id)())

    def _groups(self) -> list[str] | None:
        user = self.scope["user"]
        if not user.is_authenticated or not user.is_active:
            return None
        if user.is_superuser:
            return [ALL_RUNS]
        teams = list(teams_visible_to(user).values_list("id", flat=True))
        return [team_group(team) for team in teams] or None
