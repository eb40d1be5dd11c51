"""The soak's workload: five workflows, the runs started of each, what each must end as, and
the reviewer who decides the gates.

- chain: prepare → quote (a map over three lines: fan-out, fan-in) → pay → notify;
- gate: draft → approve (a human gate the simulated reviewer approves or rejects) → send;
- saga: hold → pay → ship, which the remote refuses: the run compensates newest first (refund,
  then release); one saga in four has its refund refused too (`compensation_failed`);
- parent: a sub-workflow (child: charge) and then a summary;
- budget: three scripted model calls under a cost budget.
Every call to the remote is an `http.request` side effect keyed by (run, step, action).
"""
import random
from dataclasses import dataclass, field

from django.contrib.auth.models import Group, User
from rest_framework.authtoken.models import Token

from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role, Run, Team, TeamMembership

# Every step retries: a step without a policy survives only LOST_ATTEMPTS_ALLOWED lost attempts
# (poison-message protection), fewer than the soak's clock jumps and partitions may cost it.
RETRY = {"max_attempts": 20, "base_s": 0.5, "max_s": 3, "jitter": True}
# Generous: each step is projected at STEPWISE_DEFAULT_STEP_COST_USD before any history exists.
BUDGET_USD = "1.00"
KINDS = ("chain", "gate", "saga", "parent", "budget")


def _post(sink: str, path: str, json: dict) -> dict:
    return {"method": "POST", "url": sink + path, "json": json, "timeout_s": 10}


def definitions(sink: str) -> list[dict]:
    order = {"order": "{{ input.order }}"}
    effect = {"type": "tool", "tool": "http.request", "side_effect": True, "retry": RETRY}
    return [
        {"name": "soak-chain", "input_schema": {"type": "object", "required": ["order"]}, "steps": [
            {"name": "prepare", "type": "tool", "tool": "core.echo", "params": order, "retry": RETRY},
            {"name": "quote", "type": "map", "after": ["prepare"], "over": "input.lines",
             "item": {"type": "tool", "tool": "core.echo", "params": {"line": "{{ item }}"}, "retry": RETRY}},
            {"name": "pay", **effect, "after": ["quote"], "params": _post(sink, "/pay", order)},
            {"name": "notify", **effect, "after": ["pay"], "params": _post(sink, "/notify", order)},
        ]},
        {"name": "soak-gate", "input_schema": {"type": "object", "required": ["order"]}, "steps": [
            {"name": "draft", "type": "tool", "tool": "core.echo", "params": order, "retry": RETRY},
            {"name": "approve", "type": "human_gate", "after": ["draft"], "approvers": "soak-leads",
             "timeout_s": 86400},
            {"name": "send", **effect, "after": ["approve"], "params": _post(sink, "/send", order)},
        ]},
        {"name": "soak-saga", "input_schema": {"type": "object", "required": ["order", "refund"]}, "steps": [
            {"name": "hold", **effect, "params": _post(sink, "/hold", order),
             "compensate": {"tool": "http.request", "params": _post(sink, "/release", order)}},
            {"name": "pay", **effect, "after": ["hold"], "params": _post(sink, "/pay", order),
             "compensate": {"tool": "http.request",
                            "params": _post(sink, "/{{ input.refund }}", order)}},
            {"name": "ship", **effect, "after": ["pay"], "params": _post(sink, "/ship", order)},
        ]},
        {"name": "soak-child", "input_schema": {"type": "object", "required": ["order"]}, "steps": [
            {"name": "charge", **effect, "params": _post(sink, "/charge", order)},
        ]},
        {"name": "soak-parent", "input_schema": {"type": "object", "required": ["order"]}, "steps": [
            {"name": "child", "type": "sub_workflow", "workflow": "soak-child", "input": order,
             "timeout_s": 86400},
            {"name": "summary", "type": "tool", "tool": "core.echo", "after": ["child"], "params": order,
             "retry": RETRY},
        ]},
        {"name": "soak-budget", "input_schema": {"type": "object", "required": ["order"]},
         "budget": {"max_cost_usd": float(BUDGET_USD), "max_duration_s": 86400}, "steps": [
            *({"name": name, "type": "agent", "model": "fast", "retry": RETRY,
               "prompt": f"Step {name} of order {{{{ input.order }}}}: answer briefly.",
               "output_schema": {"type": "object", "required": ["ok"]},
               "script": [{"output": {"ok": True, "note": "order {{ input.order }} " * 20}}],
               **({"after": [after]} if after else {})}
              for name, after in (("plan", None), ("write", "plan"), ("check", "write"))),
        ]},
    ]


@dataclass
class Started:
    """A run the soak asked for, and what it must end as."""

    order: str
    kind: str
    expected: str
    decision: str = ""  # gate: approve | reject
    refund: str = ""  # saga: refund | refund-refused
    via_api: bool = False
    run_id: str = ""
    extra: dict = field(default_factory=dict)


@dataclass
class People:
    team: Team
    requester: User
    reviewer: User
    token: str
    versions: dict


def setup(sink: str) -> People:
    team, _ = Team.objects.get_or_create(slug="soak", defaults={"name": "Soak"})
    requester, _ = User.objects.get_or_create(username="soak-requester")
    reviewer, _ = User.objects.get_or_create(username="soak-reviewer")
    TeamMembership.objects.update_or_create(team=team, user=requester, defaults={"role": Role.OWNER})
    TeamMembership.objects.update_or_create(team=team, user=reviewer, defaults={"role": Role.MEMBER})
    reviewer.groups.add(Group.objects.get_or_create(name="soak-leads")[0])
    token, _ = Token.objects.get_or_create(user=requester)
    versions = {}
    for definition in definitions(sink):
        versions[definition["name"]] = workflow_save(team=team, definition=definition, actor=requester)[0]
    return People(team, requester, reviewer, token.key, versions)


def plan(rng: random.Random, number: int) -> Started:
    """The next run to start: its kind, and what it must end as."""
    kind = KINDS[number % len(KINDS)]
    order = f"o-{number}"
    if kind == "gate":
        decision = "reject" if rng.random() < 0.25 else "approve"
        return Started(order, kind, "completed" if decision == "approve" else "failed", decision=decision)
    if kind == "saga":
        refund = "refund-refused" if rng.random() < 0.25 else "refund"
        return Started(order, kind, "failed" if refund == "refund" else "compensation_failed",
                       refund=refund)
    return Started(order, kind, "completed")


def input_of(started: Started) -> dict:
    data = {"order": started.order}
    if started.kind == "chain":
        data["lines"] = ["a", "b", "c"]
    if started.kind == "saga":
        data["refund"] = started.refund
    return data


def start_direct(people: People, started: Started) -> Run:
    """Start through the service, as a trigger would (idempotent on the order)."""
    return run_start(version=people.versions[f"soak-{started.kind}"], input=input_of(started),
                     actor=people.requester, idempotency_key=started.order)
