"""The run timeline: what the ledger says about one run, put into words.

Reads only the ledger (never the engine's tables), so a run's explanation survives the run
itself. It answers, in this order: what started the run, which data and versions influenced it,
which policy applied, who approved, which external calls were made, and how it ended; and for
every step, why it ran (or did not) and what came of it. Each entry is also checked on its
own (digest and link); `audit_verify` checks the whole chain.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from . import chain
from .models import AuditEntry

RUN_END_ACTIONS = {"run.completed", "run.failed", "run.cancelled", "run.timed_out",
                   "run.compensation_failed"}
CALL_OUTCOME_ACTIONS = {"step.completed", "step.failed", "step.retrying", "step.timed_out",
                        "step.cancelled", "effect.succeeded", "effect.failed"}


@dataclass
class Line:
    """One entry, with its sentence."""

    entry: AuditEntry
    data: dict
    text: str
    intact: bool

    @property
    def when(self):
        return self.entry.created_at


@dataclass
class StepStory:
    name: str
    lines: list[Line] = field(default_factory=list)
    model: str = ""
    prompt_version: str = ""

    @property
    def outcome(self) -> str:
        ends = [ln for ln in self.lines if ln.entry.action in {
            "step.completed", "step.failed", "step.skipped", "step.timed_out", "step.cancelled"}]
        return ends[-1].entry.outcome if ends else (self.lines[-1].entry.outcome if self.lines else "")

    @property
    def produced(self) -> str:
        """Who produced the step's output, as the ledger chained its signed record."""
        for line in reversed(self.lines):
            if line.entry.action in ("step.completed", "step.attested") and line.data.get("attestation"):
                who = line.data.get("producer") or line.entry.actor
                who = who.removeprefix("worker:")
                kind = "worker " if line.entry.action == "step.completed" else ""
                return f"produced by {kind}{who}, signed (record {_short(line.data['attestation'])})"
        return ""

    @property
    def why(self) -> str:
        """The first entry that says why the step ran or not."""
        for line in self.lines:
            if line.entry.action in ("step.ready", "step.skipped"):
                return line.text
        return ""


@dataclass
class ExternalCall:
    authorized: Line
    outcome: Line | None


@dataclass
class Timeline:
    run_id: str
    lines: list[Line]
    started: Line | None
    ended: Line | None
    steps: list[StepStory]
    approvals: list[Line]
    calls: list[ExternalCall]
    decisions: list[Line]
    children: list[str]

    @property
    def input(self):
        return self.started.data.get("input") if self.started else None

    @property
    def policy(self) -> dict:
        return self.started.data.get("policy", {}) if self.started else {}

    @property
    def broken(self) -> list[Line]:
        return [ln for ln in self.lines if not ln.intact]

    @property
    def versions(self) -> dict:
        first = self.lines[0].entry if self.lines else None
        return {"workflow": first.workflow, "version": first.workflow_version,
                "digest": first.definition_digest} if first else {}


def intact(entry: AuditEntry) -> bool:
    """The entry matches its digest and its hash (it may still be unsealed in a transaction)."""
    row = chain.entry_row(entry)
    if chain.content_digest(row) != entry.digest:
        return False
    return entry.sequence is None or entry.hash == chain.link_hash(entry.prev_hash, entry.sequence, entry.digest)


def _short(value: object, size: int = 12) -> str:
    return str(value)[:size] if value else ""


def explain(entry: AuditEntry, data: dict) -> str:
    """One sentence saying what the entry records."""
    a, who = entry.action, entry.actor
    if a == "run.created":
        parent = data.get("parent")
        via = f" as sub-workflow of run {parent['run']} (step {parent['step']})" if parent else ""
        key = f", idempotency key {entry.idempotency_key}" if entry.idempotency_key else ""
        origin = data.get("origin") or {}
        if origin.get("name"):  # a trigger started it: which one, and for which event
            via = f" trigger '{origin['name']}' ({origin.get('key', '')})"
        people = (data.get("provenance") or {}).get("people") or []
        moved = ("; set in motion by " + ", ".join(f"{p['username']} ({p['as']})" for p in people)
                 if people else "")
        return (f"Started by {who} via {data.get('trigger', '?')}{via}: workflow {entry.workflow} "
                f"v{entry.workflow_version} (definition {_short(entry.definition_digest)}){key}{moved}.")
    if a == "step.ready":
        after = ", ".join(data.get("after") or []) or "nothing"
        cond = f"; its condition `{data['when']}` held" if data.get("when") else ""
        join = " (any one is enough)" if data.get("join") == "any" else ""
        return f"Ready: it waits for {after}{join}, which finished{cond}."
    if a == "step.skipped":
        return f"Skipped: {data.get('reason') or 'by ' + who}."
    if a == "step.queued":
        why = data.get("reason") or ("retry" if data.get("retry") else "")
        return f"Queued on {data.get('queue', 'its queue')}" + (f" ({why})." if why else ".")
    if a == "step.running":
        return f"Claimed by {who}, attempt {data.get('attempt', '?')}."
    if a == "external_call.authorized":
        return (f"Authorized a {data.get('kind')} call to {data.get('target')} (attempt "
                f"{data.get('attempt')}, idempotency key {entry.idempotency_key}"
                f"{', side effect' if data.get('side_effect') else ''}).")
    if a == "step.completed":
        cost = f", cost ${data['cost_usd']}" if data.get("cost_usd") not in (None, "0", "0.000000") else ""
        signed = (f"; produced by worker {who.removeprefix('worker:')}, signed (record "
                  f"{_short(data['attestation'])})" if data.get("attestation") else "")
        return (f"Completed by {who}" + (f" (attempt {data['attempt']}{cost})" if "attempt" in data else "")
                + signed + ".")
    if a == "step.routes":
        tried = "; ".join(_route_said(r) for r in data.get("routes") or [])
        return f"Model routes tried in attempt {data.get('attempt', '?')}: {tried or 'none'}."
    if a == "step.attested":
        return (f"Output produced by {data.get('producer') or who}, signed with key {data.get('key')} "
                f"(record {_short(data.get('attestation'))}).")
    if a == "step.attestation_invalid":
        return (f"Output flagged: {data.get('problem')} (record by {data.get('producer') or 'nobody'});"
                " the run paused for an investigation.")
    if a in ("step.failed", "step.retrying", "step.timed_out"):
        message = f"{data.get('class', 'error')}: {data.get('message', '')}".strip(": ")
        retry = f"; retry at {data['at']}" if a == "step.retrying" and data.get("at") else ""
        return f"{entry.outcome.replace('_', ' ').capitalize()} ({message}){retry}."
    if a == "step.waiting":
        return f"Waiting for {data.get('for', 'an event')}."
    if a == "approval.requested" and data.get("sandboxed"):
        return (f"Approval of proposal {_short(entry.proposal_hash)} would have been requested "
                f"from group {data.get('approvers')}; the run's sandbox decides it, nobody is asked.")
    if a == "approval.requested":
        return (f"Approval requested from group {data.get('approvers')} on proposal "
                f"{_short(entry.proposal_hash)}.")
    if a == "step.cache_hit":
        return (f"Reused the output of step {data.get('from_step')} of run {data.get('from_run')}"
                f" (fingerprint {_short(data.get('fingerprint'))}): no model or tool was called, "
                "nothing was spent.")
    if a == "step.sandboxed":
        answer = "its declared response" if data.get("response_declared") else "no response declared"
        return (f"Sandboxed: {data.get('tool')} was not called; answered with {answer} "
                f"(key {data.get('key', entry.idempotency_key)}).")
    if a in ("approval.approved", "approval.rejected"):
        note = f': "{data["note"]}"' if data.get("note") else ""
        why = f" ({data['reason']})" if data.get("reason") else ""
        return (f"{entry.outcome.capitalize()} by {who} (proposal {_short(entry.proposal_hash)})"
                f"{why}{note}.")
    if a == "approval.given":
        note = f': "{data["note"]}"' if data.get("note") else ""
        return (f"Approved by {who}, {data.get('given')} of {data.get('required')} approvals "
                f"(proposal {_short(entry.proposal_hash)}){note}.")
    if a == "approval.edited":
        changed = ", ".join(data.get("changed") or [])
        return (f"Parameters {changed} edited by {who}: proposal {_short(data.get('previous_hash'))}"
                f" is now {_short(entry.proposal_hash)}.")
    if a == "approval.escalated":
        return f"Escalated from {data.get('from')} to {data.get('to')}, deadline {data.get('deadline_at')}."
    if a in ("approval.refused", "input.refused"):
        return f"Refused to {data.get('attempted')} for {who}: {data.get('reason')}."
    if a == "approval.revoked":
        return f"Approval revoked by {who}: \"{data.get('note')}\"."
    if a == "input.requested":
        asked = data.get("assignee") or f"group {data.get('group')}"
        return f"Input requested from {asked}, by {data.get('deadline_at')}."
    if a == "input.answered":
        return f"Answered by {who} (fields: {', '.join(data.get('fields') or []) or 'none'})."
    if a == "input.abstained":
        return f"{who} abstained (could not decide)."
    if a == "input.escalated":
        return f"Input escalated from {data.get('from')} to {data.get('to')}, deadline {data.get('deadline_at')}."
    if a.startswith("effect."):
        return f"Side effect {entry.outcome} (key {data.get('key', entry.idempotency_key)})."
    if a == "run.paused":
        return f"Paused by {who}: {data.get('message') or data.get('class') or 'no reason given'}."
    if a == "run.moved":
        again = data.get("gates_asked_again") or []
        asked = f" A new decision is asked at {', '.join(again)}." if again else ""
        return (f"Moved from version {(data.get('from') or {}).get('version')} to version "
                f"{(data.get('to') or {}).get('version')} by {who}: {data.get('reason')}.{asked}")
    if a == "dead_letter.redriven":
        return f"Redriven by {who} (dead letter {data.get('dead_letter')})."
    if a == "step.dead_lettered":
        return f"Dead-lettered after {data.get('attempts')} attempt(s) ({data.get('class')})."
    if a.startswith("run."):
        detail = data.get("message") or data.get("reason") or ""
        return f"Run {entry.outcome.replace('_', ' ')} ({who})" + (f": {detail}." if detail else ".")
    return f"{a} by {who}" + (f" ({entry.outcome})" if entry.outcome else "") + "."


def _route_said(route: dict) -> str:
    """One route of a model call as `step.routes` records it: what it was, and how it went."""
    where = f"{route.get('route')} ({route.get('provider')} {route.get('model_id')})"
    outcome = route.get("outcome")
    if outcome == "answered":
        cost = f", ${route['cost_usd']}" if route.get("cost_usd") not in (None, "0", "0.000000") else ""
        return f"{where} answered ({route.get('tokens_in', 0)}+{route.get('tokens_out', 0)} tokens{cost})"
    why = ": ".join(p for p in (route.get("error_class"), route.get("error")) if p)
    return f"{where} {outcome}" + (f" ({why})" if why else "")


def run_timeline(run_id) -> Timeline:
    """Everything the ledger holds about run `run_id`, in chain order."""
    chain.seal_pending()
    lines = []
    for entry in AuditEntry.objects.filter(run_id=run_id):
        data = json.loads(entry.payload)
        lines.append(Line(entry, data, explain(entry, data), intact(entry)))
    steps: dict[str, StepStory] = {}
    calls, approvals, decisions, children = [], [], [], []
    started = ended = None
    for index, line in enumerate(lines):
        entry = line.entry
        if entry.action == "run.created":
            started = line
        if entry.action in RUN_END_ACTIONS:
            ended = line
        if entry.step_name:
            story = steps.setdefault(entry.step_name, StepStory(entry.step_name))
            story.lines.append(line)
            story.model = story.model or entry.model
            story.prompt_version = story.prompt_version or entry.prompt_version
        if entry.action.startswith("approval."):
            approvals.append(line)
        if entry.action == "external_call.authorized":
            calls.append(ExternalCall(line, _call_outcome(lines[index + 1:], line)))
        if entry.action == "step.child_started" and line.data.get("child_run"):
            children.append(line.data["child_run"])
        if entry.action in ("run.paused", "run.running", "run.waiting", "run.stuck", "run.moved",
                            "dead_letter.redriven", "step.dead_lettered") or entry.action.startswith("effect."):
            decisions.append(line)
    return Timeline(str(run_id), lines, started, ended, list(steps.values()), approvals, calls,
                    decisions, children)


def _call_outcome(later: list[Line], call: Line) -> Line | None:
    for line in later:
        same_step = line.entry.step_name == call.entry.step_name
        if (same_step and line.entry.action == "external_call.authorized"
                and line.data.get("item_index") == call.data.get("item_index")):
            return None  # the next attempt started before this one was decided
        if same_step and line.entry.action in CALL_OUTCOME_ACTIONS:
            return line
    return None
