"""Gates guard actions, not names (issue 40).

The attack reproduced first: an editor saved a version that keeps the mandatory gate in front of
`send` and adds `send_early` — the same `email.send`, after `prep`, before the gate. It was
published, and a member's run sent the e-mail while the gate still waited. A mandatory gate now
guards the action its steps perform, and an owner's gate policy names actions (a tool or glob,
optionally a target) that every version must put behind a satisfying gate: on save, publish,
start by number, a trigger's pinned version, and a version published before the policy.
"""
import copy

import pytest

from audit.models import AuditEntry
from orchestrator.engine.errors import Forbidden
from orchestrator.engine.services.gate_policies import gate_policy_create
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_publish, workflow_save
from orchestrator.models import GatePolicy, Role, Run, StepState, Workflow
from tests.api.published import assert_documented
from tests.conftest import client_for
from tests.factories import SETUP, member

pytestmark = pytest.mark.django_db

SEND = {"name": "send", "type": "tool", "tool": "email.send", "side_effect": True,
        "after": ["approve"], "params": {"to": "{{ input.to }}", "subject": "Re: your ticket",
                                         "body": "{{ steps.prep.output.text }}"}}
GATED = {
    "name": "support-reply",
    "input_schema": {"type": "object", "required": ["to"], "properties": {"to": {"type": "string"}}},
    "steps": [
        {"name": "prep", "type": "tool", "tool": "core.echo", "params": {"text": "Refund granted."}},
        {"name": "approve", "type": "human_gate", "after": ["prep"], "approvers": "support_leads",
         "mandatory": True, "guards": ["send"]},
        SEND,
    ],
}


def with_steps(*extra: dict, base: dict = GATED, drop_marks: bool = False) -> dict:
    definition = copy.deepcopy(base)
    definition["steps"] += [copy.deepcopy(step) for step in extra]
    if drop_marks:
        for step in definition["steps"]:
            step.pop("mandatory", None), step.pop("guards", None)
    return definition


SEND_EARLY = {**SEND, "name": "send_early", "after": ["prep"]}
ATTACK = with_steps(SEND_EARLY)  # steps[3] is send_early
ATTACK_PATH = "steps[3].tool"


@pytest.fixture
def editor(team):
    return member(team, "editor", role=Role.EDITOR)


@pytest.fixture
def owner(team):
    return member(team, "owner", role=Role.OWNER)


@pytest.fixture
def support_member(team):
    return member(team, "member", role=Role.MEMBER)


@pytest.fixture
def gated(team):
    version, _ = workflow_save(team=team, definition=GATED, actor=SETUP)
    return version.workflow


def save(user, team, definition):
    return client_for(user).post("/api/v1/workflows/", {"definition": definition, "team": team.slug},
                                 format="json")


def paths(response) -> list[str]:
    return [e["path"] for e in response.json()["errors"]]


def policy(team, owner, **values) -> GatePolicy:
    return gate_policy_create(team=team, actor=owner, **values)


# --- the reproduction: send_early beside a mandatory gate ------------------------------------------


def test_an_editor_cannot_save_send_early_beside_the_mandatory_gate(team, gated, editor, support_member):
    response = save(editor, team, ATTACK)
    assert response.status_code == 403
    assert ATTACK_PATH in paths(response)
    assert "send_early" in response.json()["errors"][paths(response).index(ATTACK_PATH)]["message"]
    assert gated.versions.count() == 1  # nothing saved
    # A member's run still sends nothing before the gate: there is no send_early to run.
    started = client_for(support_member).post(f"/api/v1/workflows/{gated.name}/runs/",
                                              {"input": {"to": "c@customer.com"}}, format="json")
    assert started.status_code == 202
    steps = dict(Run.objects.get(pk=started.json()["id"]).steps.values_list("name", "state"))
    assert "send_early" not in steps and steps["send"] == StepState.BLOCKED


def test_an_editor_cannot_publish_a_send_early_draft(team, gated, editor):
    Workflow.objects.filter(pk=gated.pk).update(publish_on_save=False)
    assert save(editor, team, ATTACK).status_code == 201  # a draft: what runs is unchanged
    response = client_for(editor).post(f"/api/v1/workflows/{gated.name}/versions/2/publish/",
                                       {}, format="json")
    assert response.status_code == 403
    assert ATTACK_PATH in paths(response)
    assert Workflow.objects.get(pk=gated.pk).active_version.number == 1


def test_an_owner_may_save_send_early_and_the_waiver_is_audited(team, gated, owner):
    response = save(owner, team, ATTACK)
    assert response.status_code == 201
    assert Workflow.objects.get(pk=gated.pk).active_version.number == 2
    entry = AuditEntry.objects.filter(action="workflow.published").latest("id")
    assert (entry.outcome, entry.actor, entry.workflow_version) == ("waived", "user:owner", 2)
    assert any(w.startswith(f"{ATTACK_PATH}: step 'send_early' calls email.send")
               for w in entry.data["gates_waived"])


def test_starting_a_send_early_draft_by_number_is_refused_but_for_an_owner(
        team, gated, editor, support_member, owner):
    Workflow.objects.filter(pk=gated.pk).update(publish_on_save=False)
    save(editor, team, ATTACK)
    for user in (editor, support_member):
        response = client_for(user).post(f"/api/v1/workflows/{gated.name}/runs/",
                                         {"input": {"to": "c@customer.com"}, "version": 2},
                                         format="json")
        assert response.status_code == 403
        assert f"version.{ATTACK_PATH}" in paths(response)
        assert_documented(client_for(user), response, "POST", "/api/v1/workflows/{name}/runs/")
    assert not Run.objects.exists()
    run = run_start(version=gated.versions.get(number=2), input={"to": "c@customer.com"}, actor=owner)
    assert run.version.number == 2


def test_a_trigger_pinned_to_a_send_early_version_is_refused_at_firing(
        team, gated, editor, support_member):
    from triggers.models import Firing
    from triggers.services.config import trigger_create
    from triggers.services.firing import trigger_fire_api

    Workflow.objects.filter(pk=gated.pk).update(publish_on_save=False)
    save(editor, team, ATTACK)
    trigger, _ = trigger_create(team=team, kind="api", name="pinned", workflow=gated.name,
                                workflow_version=2, actor=editor,
                                input_template={"to": "{{ payload.to }}"})
    outcome = trigger_fire_api(trigger_id=trigger.id, payload={"to": "c@customer.com"}, key="k1",
                               actor=support_member)
    assert outcome.run is None and outcome.status == "invalid"
    assert f"version.{ATTACK_PATH}" in [p["path"] for p in outcome.problems]
    assert not Firing.objects.filter(run__isnull=False).exists() and not Run.objects.exists()


def test_a_step_that_already_called_the_tool_unguarded_is_not_new_weakening(team, owner, editor):
    # The published version notifies ops without the gate: a later edit elsewhere is no weakening.
    notify = {**SEND, "name": "notify", "after": ["prep"], "params": {
        "to": "ops@internal.example", "subject": "new reply", "body": "queued"}}
    workflow_save(team=team, definition=with_steps(notify), actor=owner)
    edited = with_steps(notify)
    edited["steps"][1]["instructions"] = "Check the refund."
    assert save(editor, team, edited).status_code == 201


# --- owners' policies by action ---------------------------------------------------------------------


UNMARKED = with_steps(drop_marks=True)  # the gate is there, nothing in the definition says why


def test_only_an_owner_sets_a_gate_policy_and_it_is_audited(team, editor, owner):
    body = {"tool": "email.*", "approvers": "support_leads", "team": team.slug}
    refused = client_for(editor).post("/api/v1/gate-policies/", body, format="json")
    assert refused.status_code == 403 and not GatePolicy.objects.exists()
    created = client_for(owner).post("/api/v1/gate-policies/", body, format="json")
    assert created.status_code == 201, created.json()
    assert_documented(client_for(owner), created, "POST", "/api/v1/gate-policies/")
    assert_documented(client_for(editor), refused, "POST", "/api/v1/gate-policies/")
    assert created.json()["tool"] == "email.*" and created.json()["workflow"] is None
    entry = AuditEntry.objects.filter(action="gate_policy.created").latest("id")
    assert (entry.actor, entry.data["tool"], entry.data["scope"]) == ("user:owner", "email.*", "team")
    listed = client_for(editor).get("/api/v1/gate-policies/").json()["results"]
    assert [p["id"] for p in listed] == [created.json()["id"]]
    gone = client_for(editor).delete(f"/api/v1/gate-policies/{created.json()['id']}/")
    assert gone.status_code == 403
    assert client_for(owner).delete(f"/api/v1/gate-policies/{created.json()['id']}/").status_code == 204
    assert AuditEntry.objects.filter(action="gate_policy.deleted").exists()


def test_a_glob_policy_refuses_an_ungated_call_and_passes_a_gated_one(team, editor, owner):
    policy(team, owner, tool="email.*", approvers="support_leads")
    assert save(editor, team, UNMARKED).status_code == 201  # send waits for the gate
    ungated = with_steps(SEND_EARLY, base=UNMARKED)
    response = save(editor, team, ungated)
    assert response.status_code == 403 and paths(response) == [ATTACK_PATH]
    assert "gate policy" in response.json()["errors"][0]["message"]


def test_a_step_downstream_of_the_gate_through_other_steps_passes(team, editor, owner):
    policy(team, owner, tool="email.send")
    definition = with_steps(base=UNMARKED)
    definition["steps"][2]["after"] = ["review"]
    definition["steps"].insert(2, {"name": "review", "type": "tool", "tool": "core.echo",
                                   "after": ["approve"], "params": {}})
    definition["steps"][3]["params"]["body"] = "{{ steps.review.output }}"
    assert save(editor, team, definition).status_code == 201


def test_a_gate_on_only_one_of_two_paths_is_refused(team, editor, owner):
    policy(team, owner, tool="email.send")
    definition = with_steps({"name": "triage", "type": "tool", "tool": "core.echo", "params": {}},
                            base=UNMARKED)
    send = definition["steps"][2]
    send["after"], send["join"] = ["approve", "triage"], "any"  # runs when either completed
    send["params"]["body"] = "Refund granted."
    response = save(editor, team, definition)
    assert response.status_code == 403 and paths(response) == ["steps[2].tool"]
    send["join"] = "all"  # both, so the gate too: guarded
    assert save(editor, team, definition).status_code == 201


@pytest.mark.parametrize("target, to, refused", [
    ("customer.com", "c@customer.com", True),         # the recipient's domain matches
    ("*.customer.com", "c@eu.customer.com", True),    # a glob over domains
    ("customer.com", "ops@internal.example", False),  # another domain: not guarded
    ("customer.com", "{{ input.to }}", True),         # unknown until run time: guarded
])
def test_a_policy_on_a_target_guards_only_calls_that_may_go_there(team, editor, owner, target, to,
                                                                  refused):
    policy(team, owner, tool="email.send", target=target)
    early = {**SEND_EARLY, "params": {**SEND_EARLY["params"], "to": to}}
    response = save(editor, team, with_steps(early, base=UNMARKED))
    assert response.status_code == (403 if refused else 201)
    if refused:
        assert paths(response) == [ATTACK_PATH]


@pytest.mark.parametrize("gate, satisfies", [
    ({}, True),
    ({"approvers": "editors"}, False),            # another group decides
    ({"required_approvals": {"low": 1, "medium": 2, "high": 2, "critical": 2}}, False),
    ({"required_approvals": 2}, True),
    ({"self_approval_up_to": "low"}, False),      # the starter could approve their own run
    ({"fallback": "prep_again"}, False),          # a rejected gate rescued by its fallback
])
def test_only_a_gate_that_satisfies_the_policy_guards(team, editor, owner, gate, satisfies):
    policy(team, owner, tool="email.send", approvers="support_leads", required_approvals=2)
    definition = with_steps({"name": "prep_again", "type": "tool", "tool": "core.echo",
                             "params": {}}, base=UNMARKED)
    definition["steps"][1].update({"required_approvals": 2, **gate})
    response = save(editor, team, definition)
    assert response.status_code == (201 if satisfies else 403), response.json()
    if not satisfies:
        assert paths(response) == ["steps[2].tool"]


def test_a_workflow_policy_does_not_reach_another_workflow(team, editor, owner, gated):
    policy(team, owner, tool="email.send", workflow=gated)
    other = with_steps(SEND_EARLY, base=UNMARKED)
    other["name"] = "other-reply"
    assert save(editor, team, other).status_code == 201
    mine = with_steps(SEND_EARLY, base=UNMARKED)
    assert save(editor, team, mine).status_code == 403


def test_a_policy_set_after_publishing_stops_runs_until_an_owner_publishes_again(
        team, editor, owner, support_member):
    version, _ = workflow_save(team=team, definition=with_steps(SEND_EARLY, base=UNMARKED),
                               actor=editor)
    workflow = version.workflow
    response = client_for(owner).post("/api/v1/gate-policies/",
                                      {"tool": "email.send", "team": team.slug}, format="json")
    unguarded = response.json()["unguarded_published"]
    assert [p["path"] for p in unguarded[workflow.name]] == [ATTACK_PATH]
    start = {"input": {"to": "c@customer.com"}}
    refused = client_for(support_member).post(f"/api/v1/workflows/{workflow.name}/runs/", start,
                                              format="json")
    assert refused.status_code == 403 and paths(refused) == [f"version.{ATTACK_PATH}"]
    with pytest.raises(Forbidden):  # an editor may not waive it by publishing it again
        workflow_publish(workflow_id=workflow.id, number=1, actor=editor)
    workflow_publish(workflow_id=workflow.id, number=1, actor=owner)
    entry = AuditEntry.objects.filter(action="workflow.published").latest("id")
    assert (entry.outcome, entry.actor) == ("waived", "user:owner")
    started = client_for(support_member).post(f"/api/v1/workflows/{workflow.name}/runs/", start,
                                              format="json")
    assert started.status_code == 202


def test_removing_the_policy_lets_the_published_version_run_again(team, editor, owner,
                                                                 support_member):
    version, _ = workflow_save(team=team, definition=with_steps(SEND_EARLY, base=UNMARKED),
                               actor=editor)
    set_ = policy(team, owner, tool="email.send")
    start = {"input": {"to": "c@customer.com"}}
    url = f"/api/v1/workflows/{version.workflow.name}/runs/"
    assert client_for(support_member).post(url, start, format="json").status_code == 403
    assert client_for(owner).delete(f"/api/v1/gate-policies/{set_.id}/").status_code == 204
    assert client_for(support_member).post(url, start, format="json").status_code == 202


def test_a_child_run_of_an_unguarded_published_version_is_refused(team, editor, owner):
    """The parent's step starts the child's published version: it passes the same check."""
    child, _ = workflow_save(team=team, definition={**with_steps(SEND_EARLY, base=UNMARKED),
                                                    "name": "child-reply"}, actor=editor)
    policy(team, owner, tool="email.send")
    child = Workflow.objects.get(pk=child.workflow_id).active_version  # as the parent reads it
    with pytest.raises(Forbidden) as refused:
        run_start(version=child, input={"to": "c@customer.com"}, actor=SETUP)
    assert refused.value.problems[0]["path"] == f"version.{ATTACK_PATH}"


# --- what performs an action ------------------------------------------------------------------------


def test_map_items_loop_bodies_and_compensations_perform_actions():
    from orchestrator.engine.definitions.mandatory_gates import performed_actions

    definition = {"steps": [
        {"name": "each", "type": "map", "over": "input.xs",
         "item": {"type": "tool", "tool": "email.send", "params": {"to": "{{ item }}"},
                  "compensate": {"tool": "email.send", "params": {"to": "ops@X.org"}}}},
        {"name": "again", "type": "loop", "body": [
            {"name": "pay", "type": "tool", "tool": "payments.charge", "params": {}}]},
        {"name": "book", "type": "tool", "tool": "core.echo", "params": {},
         "compensate": {"tool": "sql.execute", "params": {"connection": "Billing"}}},
        {"name": "think", "type": "agent", "model": "fast", "prompt": "hi"},
    ]}
    found = [(c.step, c.path, c.tool, sorted(c.targets), c.unresolved)
             for c in performed_actions(definition)]
    assert found == [
        ("each", "steps[0].item.tool", "email.send", [], True),
        ("each", "steps[0].item.compensate.tool", "email.send", ["x.org"], False),
        ("again", "steps[1].body[0].tool", "payments.charge", [], False),
        ("book", "steps[2].tool", "core.echo", [], False),
        ("book", "steps[2].compensate.tool", "sql.execute", ["billing"], False),
    ]


def test_a_calls_targets_are_its_connection_recipient_domains_and_url_host():
    from orchestrator.engine.definitions.mandatory_gates import call_targets

    assert call_targets("mail.send", {"connection": "outbound", "to": ["a@X.com", "b@y.org"],
                                      "cc": "c@z.net"}) == (
        frozenset({"outbound", "x.com", "y.org", "z.net"}), False)
    assert call_targets("http.request", {"url": "https://api.pay.example/v1/charge"}) == (
        frozenset({"api.pay.example"}), False)
    assert call_targets("http.request", {"url": "{{ input.url }}"}) == (frozenset(), True)
    assert call_targets("sql.execute", {"statement": "x"}) == (frozenset(), False)
