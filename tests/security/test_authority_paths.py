"""The authority matrix: every start path, every role, the same invariants (DESIGN principle 9).

Each path (`PATHS`) is driven the way its entry point is — the API, the builder's Run (the same
endpoint with the browser's session), an API trigger fired with a token, a schedule's tick, a
signed webhook delivery, a queue event, a child run of a parent started by the person, and a
bulk re-run the person asks for of a run that ended (run by the worker's service here), and a
fork of a run the engine started (`POST /api/v1/runs/<id>/fork/`, from the gate) — by
a person who is in the gate's approvers group and holds one of the team's roles. On each:

(a) the person who set the run in motion cannot approve it (403), while another approver can;
(b) a guarded action never runs before its gate: the mandatory gate holds the action it guards,
    and a call of a tool an owner's gate policy guards, made by a step outside every gate,
    starts on no path (docs/permissions.md#gate-policies);
(c) the team's cap on unfinished runs and the rate limit refuse the same way: 429, Retry-After
    and `{"errors": [{"path", "message"}]}` over HTTP, the same problems and retry for a
    schedule's slot or a queue event (which have no HTTP answer); child runs are part of their
    parent's run and are not admitted again (docs/permissions.md#admission).

A role that may not set a path up (schedules, webhooks and queue triggers need trigger.manage)
is refused there: that cell checks the refusal instead.
"""
import json
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path as FilePath
from types import SimpleNamespace

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from approvals.models import ApprovalRequest
from budgets.services import budget_limit_create
from orchestrator.engine import clock
from orchestrator.engine.errors import Forbidden
from orchestrator.engine.services.gate_policies import gate_policy_create
from orchestrator.engine.services.reruns import rerun_advance
from orchestrator.engine.services.runs import run_cancel, run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role, Run, StepRun, Workflow, WorkflowVersion
from tests.conftest import client_for
from tests.factories import SETUP, member
from tests.support.children import start_children
from triggers.models import EventDeadLetter
from triggers.services.config import trigger_create
from triggers.services.events import event_receive
from triggers.services.schedules import schedule_tick
from triggers.signatures import sign

pytestmark = pytest.mark.django_db

ROOT = FilePath(__file__).resolve().parents[2]
SOURCES = {"rabbitmq": "amqp://guest:guest@127.0.0.1:5672//"}
ROLES = [Role.MEMBER, Role.EDITOR, Role.OPERATOR, Role.OWNER]
PATHS = ["api", "builder", "api_trigger", "schedule", "webhook", "queue", "child", "rerun", "fork"]
# The paths a person sets in motion by setting a trigger up (trigger.manage).
SET_UP = {"schedule", "webhook", "queue"}

GATED = {
    "name": "gated", "input_schema": {"type": "object"},
    "steps": [
        {"name": "approve", "type": "human_gate", "approvers": "support_leads",
         "timeout_s": 3600, "mandatory": True, "guards": ["act"]},
        {"name": "act", "type": "tool", "tool": "core.echo", "after": ["approve"],
         "params": {"value": "done"}},
    ],
}
PARENT = {
    "name": "parent", "input_schema": {"type": "object"},
    "steps": [{"name": "child", "type": "sub_workflow", "workflow": "gated", "input": {},
               "timeout_s": 3600}],
}
TEMPLATE = {"note": "{{ trigger.name }}"}
SLOT_S = 10  # a schedule's interval: two slots fall within a rate's minute


@pytest.fixture(autouse=True)
def workflows(team):
    workflow_save(team=team, definition=GATED, actor=SETUP)
    workflow_save(team=team, definition=PARENT, actor=SETUP)


@pytest.fixture
def frozen(monkeypatch):
    """The engine's clock, frozen on a whole minute: a schedule's slots and the audit windows
    fall where the test puts them."""
    moment = [clock.now().replace(second=0, microsecond=0)]
    monkeypatch.setattr(clock, "_source", lambda: moment[0])
    return moment


@dataclass
class Path:
    """One start path, driven for one person: `start()` starts a run (returns the HTTP
    answer, or the firing's outcome), `runs()` the runs it started."""

    name: str
    team: object
    person: object
    frozen: list
    trigger: object = None
    source: object = None  # the run a fork is forked from
    secret: str = ""
    count: int = 0
    answers: list = field(default_factory=list)
    sources: list = field(default_factory=list)

    def set_up(self, **trigger_settings) -> None:
        """Set the path's trigger up as the person (or the engine for an API trigger, which
        the person fires). Raises Forbidden when the person may not."""
        if self.name == "rerun":  # the runs it starts again: ended before any cap is set
            version = WorkflowVersion.objects.get(workflow__name="gated", number=1)
            self.sources = [run_cancel(run_id=run_start(version=version, input={}, actor=SETUP).id,
                                       actor=SETUP) for _ in range(3)]
            return
        if self.name == "fork":  # a run the engine started, ended: it counts toward no cap
            version = WorkflowVersion.objects.get(workflow__name="gated", number=1)
            self.source = run_start(version=version, input={}, actor=SETUP)
            run_cancel(run_id=self.source.id, actor=SETUP)
            return
        kind = {"api_trigger": "api", "schedule": "schedule", "webhook": "webhook",
                "queue": "queue"}.get(self.name)
        if kind is None:
            return
        actor = self.person if self.name in SET_UP else SETUP
        values = {"input_template": TEMPLATE, **trigger_settings}
        if kind == "schedule":
            values.update(interval_s=SLOT_S)
        if kind == "queue":
            values.update(source="rabbitmq", exchange="helpdesk", binding_key="tickets.*")
        with override_settings(STEPWISE_EVENT_SOURCES=SOURCES):
            self.trigger, self.secret = trigger_create(
                team=self.team, kind=kind, name=f"by-{self.person.username}"[:64],
                workflow="gated", actor=actor, **values)

    def start(self):
        self.count += 1
        n = self.count
        if self.name == "api":
            return client_for(self.person).post("/api/v1/workflows/gated/runs/", {"input": {}},
                                                format="json")
        if self.name == "child":
            answer = client_for(self.person).post("/api/v1/workflows/parent/runs/",
                                                  {"input": {}}, format="json")
            if answer.status_code == 202:  # the child is created by a worker: do what it does
                start_children(Run.objects.get(pk=answer.json()["id"]))
            return answer
        if self.name == "rerun":
            published = Workflow.objects.get(name="gated").active_version.number
            answer = client_for(self.person).post(
                "/api/v1/runs/rerun/", {"runs": [str(self.sources[n - 1].id)], "version": published},
                format="json", HTTP_IDEMPOTENCY_KEY=f"k-{n}")
            if answer.status_code != 202:
                return answer
            item = rerun_advance(rerun_id=answer.json()["id"]).items.get()  # what its worker does
            return SimpleNamespace(status=item.outcome, problems=item.problems,
                                   retry_after_s=item.retry_after_s)
        if self.name == "fork":
            return client_for(self.person).post(f"/api/v1/runs/{self.source.id}/fork/",
                                                {"step": "approve"}, format="json")
        if self.name == "builder":
            browser = APIClient()
            browser.force_login(self.person)
            return browser.post("/api/v1/workflows/gated/runs/?team=support&via=builder",
                                {"input": {}, "version": 1}, format="json")
        if self.name == "api_trigger":
            return client_for(self.person).post(f"/api/v1/triggers/{self.trigger.id}/fire/", {},
                                                format="json", HTTP_IDEMPOTENCY_KEY=f"k-{n}")
        if self.name == "webhook":
            raw = json.dumps({"n": n}).encode()
            stamp = int(clock.now().timestamp())
            return APIClient().generic(
                "POST", f"/api/v1/hooks/{self.trigger.id}/", raw, content_type="application/json",
                HTTP_WEBHOOK_ID=f"d-{n}", HTTP_WEBHOOK_TIMESTAMP=str(stamp),
                HTTP_WEBHOOK_SIGNATURE=sign(self.secret, f"d-{n}", stamp, raw))
        if self.name == "schedule":
            self.frozen[0] += timedelta(seconds=SLOT_S)
            outcomes = schedule_tick(trigger_id=self.trigger.id)
            return outcomes[-1]
        if self.name == "queue":
            with override_settings(STEPWISE_EVENT_SOURCES=SOURCES):
                return event_receive(trigger_id=self.trigger.id, message_id=f"m-{n}",
                                     body=json.dumps({"n": n}).encode(),
                                     meta={"exchange": "helpdesk", "routing_key": "tickets.new",
                                           "headers": {}})
        raise AssertionError(self.name)

    def gated_runs(self):
        """The runs of `gated` this path started (for `child`: the children; for `rerun`: the
        new runs, not the ended ones it started again; for `fork`: the forks)."""
        runs = Run.objects.filter(version__workflow__name="gated").order_by("created_at")
        if self.name == "rerun":
            return runs.filter(trigger="rerun")
        return runs.filter(forked_from__isnull=False) if self.name == "fork" else runs


def path_for(name: str, team, person, frozen) -> Path:
    return Path(name, team, person, frozen)


def person_with(team, role: str):
    """A person of `role` who is also in the gate's approvers group."""
    return member(team, f"{role}_lead", role=role, groups=("support_leads",))


def started(answer) -> bool:
    status = getattr(answer, "status_code", None)
    if status is not None:
        return status in (200, 202)
    return answer.status == "started"


def approve(user, approval):
    return client_for(user).post(f"/api/v1/approvals/{approval.id}/approve/",
                                 {"proposal_hash": approval.proposal_hash}, format="json")


CELLS = [(path, role) for path in PATHS for role in ROLES]
# The `path` each recorded in the run's provenance (the rows of docs/permissions.md's tables).
RECORDED = {"api": "api", "builder": "builder", "api_trigger": "api_trigger",
            "schedule": "schedule", "webhook": "webhook", "queue": "queue",
            "child": "sub_workflow", "rerun": "rerun", "fork": "fork"}


def doc_table(marker: str) -> dict[str, list[str]]:
    """A table of docs/permissions.md between its markers: {path: [the other cells]}."""
    text = (ROOT / "docs" / "permissions.md").read_text()
    table = text.split(f"<!-- {marker}:start -->")[1].split(f"<!-- {marker}:end -->")[0]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in table.strip().splitlines()[2:]]
    return {row[0].strip("`"): row[1:] for row in rows}


PROVENANCE_DOC = doc_table("provenance-matrix")
ADMISSION_DOC = doc_table("admission-matrix")


def test_the_documented_tables_have_every_path_the_matrix_drives():
    assert set(PROVENANCE_DOC) == set(ADMISSION_DOC) == set(RECORDED.values())


# --- (a) whoever set the run in motion does not approve it ------------------------------------


@pytest.mark.parametrize("path, role", CELLS)
def test_a_the_person_who_set_the_run_in_motion_cannot_approve_it(path, role, team, frozen):
    person = person_with(team, role)
    other = member(team, "other_lead", role=Role.MEMBER, groups=("support_leads",))
    way = path_for(path, team, person, frozen)
    may_set_up = path not in SET_UP or role in (Role.EDITOR, Role.OWNER)
    if not may_set_up:
        with pytest.raises(Forbidden):
            way.set_up()
        return
    way.set_up()

    answer = way.start()

    assert started(answer), getattr(answer, "content", answer)
    run = way.gated_runs().get()
    recorded = RECORDED[path]
    assert run.provenance["path"] == recorded
    mine = [p for p in run.provenance["people"] if p["user"] == person.pk]
    documented = PROVENANCE_DOC[recorded][1]
    assert [p["as"] for p in mine] == [documented.split(" (")[0]], (run.provenance, documented)
    approval = ApprovalRequest.objects.get(run=run)
    refused = approve(person, approval)
    assert refused.status_code == 403, refused.content
    assert "separation of duties" in refused.json()["errors"][0]["message"]
    assert ApprovalRequest.objects.get(pk=approval.pk).state == "pending"
    assert approve(other, approval).status_code == 200


# --- (b) a guarded action never runs before its gate -------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_b_a_guarded_action_never_runs_before_its_gate(path, team, frozen):
    """The mandatory gate holds the step that performs the action it guards."""
    person = person_with(team, Role.OWNER)
    way = path_for(path, team, person, frozen)
    way.set_up()

    assert started(way.start())

    run = way.gated_runs().get()
    assert ApprovalRequest.objects.get(run=run).state == "pending"
    act = StepRun.objects.get(run=run, name="act")
    assert act.state in ("pending", "blocked") and act.started_at is None, act.state


EARLY = {**GATED, "steps": [
    *GATED["steps"],
    {"name": "act_early", "type": "tool", "tool": "core.echo", "params": {"value": "early"}},
]}


@pytest.mark.parametrize("path", PATHS)
def test_b_a_call_a_gate_policy_guards_runs_on_no_path_outside_its_gate(path, team, frozen):
    """`act_early` calls the tool an owner's policy guards, beside the gate rather than after
    it, in the published version: the policy came after it was published. Whichever path
    starts it, `act_early` never runs (a start answers a refusal, or its run never reaches it).
    A person starts as an editor (an owner may waive gates, as when publishing); a trigger a
    person set up (an owner here) starts as the trigger, which waives nothing."""
    person = person_with(team, Role.OWNER if path in SET_UP else Role.EDITOR)
    way = path_for(path, team, person, frozen)
    way.set_up()
    workflow_save(team=team, definition=EARLY, actor=SETUP)
    gate_policy_create(team=team, actor=SETUP, tool="core.*")

    way.start()

    early = StepRun.objects.filter(run__version__workflow__name="gated", name="act_early")
    assert not early.exclude(state__in=("pending", "blocked")).exists(), list(
        early.values_list("state", flat=True))
    assert not early.filter(started_at__isnull=False).exists()


# --- (c) the team's cap and the rate limit refuse the same way --------------------------------


def refusal_shape(answer) -> tuple[int, str, list[dict]]:
    """(status, Retry-After, errors) of a refusal, whatever the path: an HTTP answer, or the
    outcome of a schedule's slot or a queue event (its dead letter's problems)."""
    if hasattr(answer, "status_code"):
        body = answer.json()
        assert set(body) == {"errors"}, body
        assert all(set(e) == {"path", "message"} for e in body["errors"]), body
        return answer.status_code, answer.get("Retry-After", ""), body["errors"]
    assert answer.status == "refused", answer
    return 429, str(answer.retry_after_s or ""), answer.problems


@pytest.mark.parametrize("path", [p for p in PATHS if ADMISSION_DOC[RECORDED[p]][0] == "yes"
                                  or p == "child"])
def test_c_the_team_cap_refuses_every_path_the_same_way(path, team, frozen):
    person = person_with(team, Role.OWNER)
    way = path_for(path, team, person, frozen)
    way.set_up()
    assert started(way.start())
    budget_limit_create(team=team, actor=SETUP, max_concurrent_runs=1)

    answer = way.start()

    status, retry, errors = refusal_shape(answer)  # a child path: its parent is refused
    assert (status, retry) == (429, "30"), errors
    assert errors == [{"path": "", "message": "team 'support' has 1 unfinished runs; its limit is 1"}]
    if path == "queue":
        assert EventDeadLetter.objects.get(key="message:m-2").reason_class == "concurrent_runs"


def test_c_a_child_run_is_not_admitted_again_nor_counted(team, frozen):
    """A parent admitted under the cap starts its child even at the cap: the child is part of
    the parent's run, and refusing it would fail the parent for holding its own place. (On the
    `child` path above, the parent is what the cap refuses.)"""
    assert ADMISSION_DOC["sub_workflow"] == ["no", "none"]
    person = person_with(team, Role.MEMBER)
    budget_limit_create(team=team, actor=SETUP, max_concurrent_runs=1)

    answer = path_for("child", team, person, frozen).start()

    assert answer.status_code == 202
    assert Run.objects.filter(version__workflow__name="gated", parent_step__isnull=False).count() == 1


RATED = [(path, rate) for path in PATHS
         for rate in ADMISSION_DOC[RECORDED[path]][1].split(", ") if rate != "none"]


@pytest.mark.parametrize("path, rate", RATED)
def test_c_the_rate_limit_refuses_every_path_the_same_way(path, rate, team, frozen, settings):
    """Each rate the documented table names, alone: a person's and a token's run starts (API,
    builder, API trigger) and a trigger's own (schedule, webhook, queue event, API trigger) —
    the same 429 with Retry-After and errors shape."""
    settings.STEPWISE_RUN_START_RATES = {
        "run_start.person": "1/min" if rate == "person" else None,
        "run_start.token": "1/min" if rate == "token" else None}
    person = person_with(team, Role.OWNER)
    way = path_for(path, team, person, frozen)
    way.set_up(max_per_minute=1 if rate == "trigger" else 60)
    assert started(way.start())

    answer = way.start()

    status, retry, errors = refusal_shape(answer)
    assert status == 429 and retry.isdigit() and 1 <= int(retry) <= 60, (status, retry)
    assert len(errors) == 1 and errors[0]["path"] == ""
    expected = {"person": "this person started 1 runs in the last 60 seconds",
                "token": "this API token started 1 runs in the last 60 seconds",
                "trigger": "started 1 runs in the last minute (max_per_minute 1)"}[rate]
    assert expected in errors[0]["message"], errors


@pytest.mark.parametrize("path", ["api", "child"])
def test_c_the_cap_and_the_rate_answer_in_one_shape(path, team, frozen, settings):
    """Over HTTP the two refusals differ only in their message and Retry-After."""
    person = person_with(team, Role.MEMBER)
    way = path_for(path, team, person, frozen)
    assert started(way.start())
    budget_limit_create(team=team, actor=SETUP, max_concurrent_runs=1)
    capped = way.start()
    settings.STEPWISE_RUN_START_RATES = {"run_start.person": "2/min", "run_start.token": None}
    rated = way.start()

    assert capped.status_code == rated.status_code == 429
    assert capped["Retry-After"] and rated["Retry-After"]
    assert set(capped.json()) == set(rated.json()) == {"errors"}
    assert [set(e) for e in capped.json()["errors"]] == [set(e) for e in rated.json()["errors"]]


@pytest.mark.parametrize("path", ["api", "builder", "api_trigger"])
def test_c_a_cache_that_cannot_be_reached_does_not_stop_run_starts(path, team, frozen, settings):
    """The rates are counted in the cache (Redis in production); a run lives in the database.
    While the cache is down a start is not rate-limited, and is never a 500."""
    settings.STEPWISE_RUN_START_RATES = {"run_start.person": "1/min", "run_start.token": "1/min"}
    settings.CACHES = {"default": {  # a real Redis client, refused by a port nothing listens on
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": "redis://127.0.0.1:9/0", "OPTIONS": {"socket_connect_timeout": 1}}}
    person = person_with(team, Role.OWNER)
    way = path_for(path, team, person, frozen)
    way.set_up(max_per_minute=60)

    assert started(way.start())
    assert started(way.start())  # over the rate, uncounted
