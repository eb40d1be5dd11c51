"""The one recording service of the audit ledger, and the operations on the ledger itself.

- `audit_record(...)` appends one entry. Every other function here, and every later feature
  (budgets, redrive, ...), records through it. It must run inside the transaction of the change
  it records; it refuses otherwise, so an entry can never survive a rollback of its change,
  nor a change commit without its entry.
- `audit_record_events(events)` is called by `orchestrator.engine.events` for every outbox event:
  one ledger entry per state change, enriched with what explains it (versions, inputs, policy).
- `external_call_authorize(...)` is called by the executors right before a tool or model call.
  It commits its entry in its own transaction *before* the call, so a worker that dies during
  the call leaves the evidence that the call was authorized, with its idempotency key.
- `audit_prune(...)` is retention: the only way entries leave the ledger (see docs/audit.md),
  behind a signed checkpoint, and exported to the archive storage first when one is configured.

Nothing here schedules work; only a prune writes outside the database (its archive and its
signed checkpoints).
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property
from pathlib import Path
from typing import Protocol

from django.conf import settings
from django.core.files import File
from django.core.files.storage import storages
from django.db import connection, transaction

from orchestrator.engine.artifacts import MARKER, offload, threshold
from orchestrator.engine.clock import now
from orchestrator.engine.hashing import canonical_json
from orchestrator.engine.keys import idempotency_key_for, worker_id
from orchestrator.engine.prompts import prompt_hash
from orchestrator.engine.selectors import definition_of
from orchestrator.engine.states import WORKER_KINDS
from orchestrator.models import Event, Run, StepRun

from . import anchoring, chain
from .export import export_range
from .models import ActorKind, AuditEntry, CheckpointRecord, SubjectType
from .redaction import Policy, Redactor, keyed_hash, reference
from .triggers import SQLITE_NO_DELETE


class CallContext(Protocol):
    """What an executor knows of the call it is about to make (`executors.ExecContext`)."""

    run_id: str
    step_id: int
    step_name: str
    attempt: int
    idempotency_key: str


# Read once: `ActorKind.values` builds a new list at every access, and every entry asks.
_ACTOR_KINDS = frozenset(ActorKind.values)


def actor_kind(actor: str) -> str:
    prefix = actor.split(":", 1)[0]
    return prefix if prefix in _ACTOR_KINDS else ActorKind.SYSTEM


def audit_record(*, action: str, actor: str, subject_type: str, subject_id: object,
                 outcome: str = "", run: Run | None = None, step: StepRun | None = None,
                 payload: dict | None = None, payload_ref: str = "", redactor: Redactor | None = None,
                 proposal_hash: str = "", model: str = "", prompt_version: str = "",
                 idempotency_key: str = "", correlation_id: str = "", event_id: int | None = None,
                 workflow: str = "", workflow_version: int | None = None,
                 definition_digest: str = "", team: str = "") -> AuditEntry:
    """Append one entry to the ledger, in the caller's transaction, and return it.

    With `run`, the workflow, version, definition digest and team are taken from it and its
    workflow's redaction policy applies to `payload` (secrets are always redacted). Callers
    that already redacted content with `redactor` pass it, so the policy is resolved once.

    Raises RuntimeError outside `transaction.atomic()`.
    """
    if not connection.in_atomic_block:
        raise RuntimeError("audit_record must run inside the transaction of the change it records")
    return chain.link_and_insert(_entry(
        action=action, actor=actor, subject_type=subject_type, subject_id=subject_id,
        outcome=outcome, run=run, step=step, payload=payload, payload_ref=payload_ref,
        redactor=redactor, proposal_hash=proposal_hash, model=model,
        prompt_version=prompt_version, idempotency_key=idempotency_key,
        correlation_id=correlation_id, event_id=event_id, workflow=workflow,
        workflow_version=workflow_version, definition_digest=definition_digest, team=team))


def _entry(**arguments) -> AuditEntry:
    """The entry `audit_record` appends, not yet linked nor saved."""
    return AuditEntry(**_entry_fields(**arguments))


def _entry_fields(*, action: str, actor: str, subject_type: str, subject_id: object, outcome: str,
                  run: Run | None, step: StepRun | None, payload: dict | None, payload_ref: str,
                  redactor: Redactor | None, proposal_hash: str, model: str, prompt_version: str,
                  idempotency_key: str, correlation_id: str, event_id: int | None, workflow: str,
                  workflow_version: int | None, definition_digest: str, team: str) -> dict:
    """The content fields of an entry (`chain.CONTENT_FIELDS`), as `AuditEntry` takes them."""
    if run is not None:
        context = RunContext.of(run)
        workflow = workflow or context.workflow
        workflow_version = workflow_version or context.version_number
        definition_digest = definition_digest or context.digest
        team = team or context.team
        redactor = redactor or context.redactor
    redactor = redactor or Redactor(Policy())
    return dict(
        created_at=now(), actor=actor[:200], actor_kind=actor_kind(actor), action=action[:64],
        subject_type=subject_type, subject_id=str(subject_id)[:100], team=team,
        workflow=workflow, workflow_version=workflow_version, definition_digest=definition_digest,
        run_id=run.id if run is not None else None, step_name=step.name if step is not None else "",
        event_id=event_id, proposal_hash=proposal_hash, model=model[:100],
        prompt_version=prompt_version, idempotency_key=redactor.text(idempotency_key)[:255],
        correlation_id=redactor.text(correlation_id)[:255], outcome=outcome[:32],
        payload=_payload_text(redactor.scrub(payload or {})), payload_ref=payload_ref[:255],
    )


def _payload_text(scrubbed: dict) -> str:
    """The payload's canonical JSON, a long value in it referenced by its SHA-256 (an artifact,
    stored once, shared with the row that holds the same value) rather than copied: the digest
    then covers the reference. A short payload is serialized once, as it always was."""
    text = canonical_json(scrubbed)
    if len(text) <= threshold() and MARKER not in text or threshold() <= 0:
        return text
    # Each top-level value on its own, never the payload whole: its short fields (the
    # attestation a completion chains, an id) stay readable where they are searched for.
    return canonical_json({key: offload(value) for key, value in scrubbed.items()})


# --- what a run's entries are explained by --------------------------------------------------


@dataclass
class RunContext:
    """What every entry of one run needs: its pinned definition, versions and redaction."""

    run: Run

    @classmethod
    def of(cls, run: Run) -> RunContext:
        # Cached on the instance: a transaction that records many events of one run (the
        # scheduler's batch) resolves the definition and the sensitive values once.
        context = getattr(run, "_audit_context", None)
        if context is None:
            context = cls(run)
            run._audit_context = context
        return context

    @cached_property
    def definition(self) -> dict:
        return definition_of(self.run)[0]

    @cached_property
    def specs(self) -> dict[str, dict]:
        return {s["name"]: s for s in self.definition["steps"]}

    @property
    def workflow(self) -> str:
        return self.run.version.workflow.name

    @property
    def version_number(self) -> int:
        return self.run.version.number

    @property
    def digest(self) -> str:
        return self.run.version.digest

    @cached_property
    def team(self) -> str:
        return self.run.team.slug

    @cached_property
    def policy(self) -> Policy:
        return Policy.of(self.definition)

    @property
    def redactor(self) -> Redactor:
        """Built fresh each time: step outputs that hold sensitive values appear as steps end."""
        return Redactor.for_namespace(self.policy, self.namespace())

    def namespace(self) -> dict:
        steps = {}
        if self.policy.wants_all_steps() or self.policy.step_names():
            queryset = StepRun.objects.filter(run_id=self.run.id, output__isnull=False)
            if not self.policy.wants_all_steps():
                queryset = queryset.filter(name__in=self.policy.step_names())
            steps = {name: {"output": output} for name, output in queryset.values_list("name", "output")}
        return {"input": self.run.input, "steps": steps}

    def model_of(self, spec: dict | None) -> tuple[str, str]:
        """(model, prompt version) of an agent step or of a map step's agent item."""
        if spec and spec["type"] == "map":
            spec = spec["item"]
        if not spec or spec["type"] != "agent":
            return "", ""
        # The same prompt version the attempt record carries (templates + framing version).
        return spec["model"], "sha256:" + prompt_hash(spec)


def policy_summary(definition: dict) -> dict:
    """The rules a run is held to, as recorded when it starts."""
    steps = definition["steps"]
    policy = Policy.of(definition)
    return {
        "on_error": definition.get("on_error"),
        "max_parallel": definition.get("max_parallel"),
        "budget": definition.get("budget"),
        "gates": [{"step": s["name"], "approvers": s["approvers"], "timeout_s": s.get("timeout_s")}
                  for s in steps if s["type"] == "human_gate"],
        "side_effects": [s["name"] for s in steps if s["type"] == "tool" and s.get("side_effect")],
        "retries": {s["name"]: s["retry"]["max_attempts"] for s in steps
                    if (s.get("retry") or {}).get("max_attempts", 1) > 1},
        "audit": {"store_prompts": policy.store_prompts,
                  "sensitive": [".".join(p) for p in policy.sensitive]},
    }


def correlation_of(output: object) -> str:
    """An identifier an external system gave a call, if its output carries a usual one."""
    if not isinstance(output, dict):
        return ""
    headers = {str(k).lower(): v for k, v in (output.get("headers") or {}).items()} \
        if isinstance(output.get("headers"), dict) else {}
    for value in (output.get("message_id"), output.get("request_id"), output.get("external_id"),
                  headers.get("x-request-id"), headers.get("request-id"),
                  headers.get("x-correlation-id")):
        if isinstance(value, str | int) and not isinstance(value, bool) and str(value):
            return str(value)
    return ""


def _content(context: RunContext, redactor: Redactor, value: object, at: tuple[str, ...],
             location: str) -> object:
    if context.policy.by_reference:
        return reference(location, value)
    return redactor.content(value, at)


def audit_record_events(events: list[Event]) -> None:
    """One ledger entry per outbox event, in the events' transaction and order (one INSERT).

    Raises RuntimeError outside `transaction.atomic()`.
    """
    if not connection.in_atomic_block:
        raise RuntimeError("audit_record must run inside the transaction of the change it records")
    chain.append_all([_event_fields(event) for event in events])


def _event_fields(event: Event) -> dict:
    run, step, kind = event.run, event.step, event.kind
    context = RunContext.of(run)
    redactor = context.redactor
    payload = dict(event.payload or {})
    spec = context.specs.get(step.name) if step is not None else None
    details: dict = {}
    if kind.startswith("approval."):
        subject = (SubjectType.APPROVAL, payload.get("approval", ""))
    elif step is not None:
        subject = (SubjectType.STEP, step.id)
    else:
        subject = (SubjectType.RUN, run.id)

    if kind == "run.created":
        payload["input"] = _content(context, redactor, run.input, ("input",), f"orchestrator.run:{run.id}#input")
        payload["policy"] = policy_summary(context.definition)
        if run.parent_step_id:
            parent = StepRun.objects.values_list("run_id", "name").get(id=run.parent_step_id)
            payload["parent"] = {"run": str(parent[0]), "step": parent[1]}
        details["idempotency_key"] = run.idempotency_key or ""
    elif kind == "run.completed":
        payload = {"output": {name: _content(context, redactor, value, ("steps", name, "output"),
                                             f"orchestrator.run:{run.id}#output.{name}")
                              for name, value in payload.items()}}
    if spec is not None:
        details["model"], details["prompt_version"] = context.model_of(spec)
        if kind == "step.ready":
            payload.update(after=spec["after"], when=spec.get("when"), join=spec.get("join"),
                           input_hash=keyed_hash(step.input))
            details["payload_ref"] = f"orchestrator.steprun:{step.id}#input"
        elif kind == "step.completed":
            payload["output"] = _content(context, redactor, step.output, ("steps", step.name, "output"),
                                         f"orchestrator.steprun:{step.id}#output")
            if spec["type"] == "tool":
                details["correlation_id"] = correlation_of(step.output)
            if isinstance(step.output, dict) and step.output.get("proposal_hash"):
                # A gate's decision, or an agent's proposal: the exact thing decided on.
                details["proposal_hash"] = str(step.output["proposal_hash"])
        if spec["type"] in WORKER_KINDS and kind in {
                "step.queued", "step.running", "step.completed", "step.failed", "step.retrying",
                "step.timed_out"}:
            details["idempotency_key"] = idempotency_key_for(run.id, step.name)
    if payload.get("proposal_hash"):
        details["proposal_hash"] = str(payload["proposal_hash"])
    details = {"payload_ref": "", "proposal_hash": "", "model": "", "prompt_version": "",
               "idempotency_key": "", "correlation_id": "", **details}
    return _entry_fields(
        action=kind, actor=event.actor, subject_type=subject[0], subject_id=subject[1],
        outcome=kind.split(".", 1)[-1], run=run, step=step, payload=payload, redactor=redactor,
        event_id=event.id, workflow="", workflow_version=None, definition_digest="", team="",
        **details)


# --- external calls -------------------------------------------------------------------------


def external_call_authorize(*, ctx: CallContext, spec: dict, step_input: dict, kind: str,
                            target: str, request: dict) -> AuditEntry:
    """Commit the entry that authorizes one tool or model call, before the call is made.

    `ctx` is the executor's context (run, step, attempt, idempotency key); `kind` is "tool" or
    "model"; `target` the tool name or provider:model; `request` the rendered params or prompt
    (redacted, or kept by reference under `store_prompts: reference`). `step_input` is the
    step's context ({"input", "steps"}), where the workflow's sensitive values are found.

    Raises RuntimeError if called inside a transaction: the entry would not be committed
    before the call, and a crash during the call would take the evidence with it.
    """
    scrub = getattr(ctx, "scrub", None)  # the run's secret inputs, masked (secret_inputs)
    if scrub is not None:
        step_input, request = scrub(step_input), scrub(request)
    with transaction.atomic(durable=True):
        run = Run.objects.select_related("version__workflow", "team").defer(
            "version__definition", "version__normalized").get(id=ctx.run_id)
        steps = StepRun.objects.only("id", "name", "run_id")
        step = (steps.get(id=ctx.step_id) if getattr(ctx, "step_id", 0)
                else steps.get(run_id=run.id, name=ctx.step_name))
        context = RunContext.of(run)
        redactor = Redactor.for_namespace(context.policy, {"input": step_input.get("input"),
                                                           "steps": step_input.get("steps") or {}})
        model, prompt_version = context.model_of(spec)
        location = (f"orchestrator.workflowversion:{run.version_id}#steps.{ctx.step_name}"
                    f" rendered with orchestrator.steprun:{step.id}#input")
        body = reference(location, request) if context.policy.by_reference else redactor.scrub(request)
        payload = {"kind": kind, "target": target, "attempt": ctx.attempt,
                   "side_effect": bool(spec.get("side_effect")), "request": body}
        if "item" in step_input:
            payload["item_index"] = step_input.get("index")
        return audit_record(
            action="external_call.authorized", actor=f"worker:{worker_id()}",
            subject_type=SubjectType.STEP, subject_id=step.id, outcome="authorized", run=run,
            step=step, payload=payload, redactor=redactor, idempotency_key=ctx.idempotency_key,
            model=model, prompt_version=prompt_version)


# --- retention ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardPrune:
    """What a prune removes from one shard's chain: sequences `first`..`through`."""
    first: int
    through: int
    through_hash: str
    count: int


@dataclass(frozen=True)
class PruneResult:
    deleted: int
    through_sequence: int | None   # shard 0's last deleted entry (None: none of shard 0's)
    checkpoint: AuditEntry | None
    archive: str = ""   # the export of what was deleted, in the archive storage
    shards: dict[int, ShardPrune] | None = None


def audit_prune(*, before: datetime, actor: str, dry_run: bool = False) -> PruneResult:
    """Delete the oldest entries of every shard's chain, all created before `before`, leaving a
    checkpoint.

    With an archive storage (`STORAGES["audit_archive"]`), what is deleted is exported there
    first, as a JSON Lines file and its manifest (`audit_verify --export` checks them offline).
    The deleted entries are covered by a signed checkpoint before they go (the archive's, or
    one written for the prune), and the head after the prune is signed once it is committed.
    Raises ImproperlyConfigured without a signing key, and the stores' errors (OSError,
    botocore's), which leave the ledger as it was.

    From each shard deletes a prefix of its chain (sequences 1..N, or the first remaining..N
    after an earlier prune), where N is the last entry such that it and every entry before it
    are older than `before`; a shard keeps its newest entry, the head its next entry links to
    (shard 0's head is the prune's own entry). First appends an `audit.pruned` entry (shard 0)
    holding each shard's N and the hash of its entry N, and the anchors of earlier prunes of
    the shards it leaves alone, so `audit_verify` can anchor every remaining chain. The
    triggers let a DELETE through only inside this transaction (PostgreSQL: `SET LOCAL
    stepwise.audit_prune = 'on'`; SQLite: the delete guard is dropped and recreated) and only
    for entries a checkpoint of their shard covers.
    """
    with transaction.atomic(durable=True):
        chain.chain_lock()
        chain.seal_pending()
        plan = _prune_plan(before)
        if not plan:
            return PruneResult(0, None, None)
        count = sum(part.count for part in plan.values())
        through = plan[0].through if 0 in plan else None
        if dry_run:
            return PruneResult(count, through, None, shards=plan)
        # What goes is first archived (when an archive is configured) and covered by a signed
        # checkpoint, both of the heads before this prune's own entry, which could still roll back.
        archived = _archive(plan) if ARCHIVE in settings.STORAGES else ""
        if not archived and not _signed(plan):
            anchoring.checkpoint_write(reason="prune")
        checkpoint = audit_record(
            action=chain.PRUNE_ACTION, actor=actor, subject_type=SubjectType.LEDGER,
            subject_id="audit_entry", outcome="pruned",
            payload={**_anchors(plan), "deleted": count, "before": before.isoformat(),
                     **({"archive": archived} if archived else {})})
        # Link the checkpoint now, while the entries it covers are still the head. Sealed at
        # COMMIT (PostgreSQL), after the delete, it would find no head once every entry was
        # pruned, and start the chain again at sequence 1 from the genesis hash.
        chain.seal_pending()
        with _deletes_allowed():
            deleted = sum(AuditEntry.objects.filter(shard=shard, sequence__lte=part.through).delete()[0]
                          for shard, part in plan.items())
    # The new heads, the prune's own entry among them, signed once the prune is committed.
    anchoring.checkpoint_write(reason="pruned")
    return PruneResult(deleted, through, checkpoint, archived, plan)


def _prune_plan(before: datetime) -> dict[int, ShardPrune]:
    """shard -> what a prune before `before` deletes from it, for each shard it deletes from."""
    plan = {}
    for shard in chain.shards_present():
        sealed = AuditEntry.objects.filter(shard=shard, sequence__isnull=False)
        first_kept = (sealed.filter(created_at__gte=before).order_by("sequence")
                      .values_list("sequence", flat=True).first())
        if first_kept is None and shard:
            # The head stays: a chain with no entry left would start again at sequence 1.
            first_kept = sealed.order_by("-sequence").values_list("sequence", flat=True).first()
        through = (sealed.filter(sequence__lt=first_kept) if first_kept else sealed).order_by(
            "-sequence").values_list("sequence", "hash").first()
        if through is None:
            continue
        first = chain.first_sequence(shard)
        plan[shard] = ShardPrune(first, through[0], through[1], through[0] - first + 1)
    return plan


def _anchors(plan: dict[int, ShardPrune]) -> dict:
    """The prune entry's anchors: shard 0's at the top level, the others' under "shards"; a
    shard pruned before and not now keeps its last anchor, which its chain still starts after."""
    anchors = {shard: {"through_sequence": max(found), "through_hash": found[max(found)]}
               for shard, found in chain.prune_anchors().items() if shard not in plan}
    for shard, part in plan.items():
        anchors[shard] = {"through_sequence": part.through, "through_hash": part.through_hash,
                          "from_sequence": part.first, "deleted": part.count}
    others = {str(shard): anchors[shard] for shard in sorted(anchors) if shard}
    return {**{name: value for name, value in anchors.get(0, {}).items() if name != "deleted"},
            **({"shards": others} if others else {})}


def _signed(plan: dict[int, ShardPrune]) -> bool:
    """Whether the newest signed checkpoint covers every entry the prune deletes."""
    record = CheckpointRecord.objects.order_by("-sequence", "-created_at").only("sequence", "heads").first()
    if record is None:
        return False
    signed = {int(shard): head[0] for shard, head in record.heads.items()} | {0: record.sequence}
    return all(signed.get(shard, 0) >= part.through for shard, part in plan.items())


ARCHIVE = "audit_archive"


def _archive(plan: dict[int, ShardPrune]) -> str:
    """Export the entries `plan` deletes with their signed manifest into the archive storage
    (`STORAGES["audit_archive"]`); the file's name there. Raises the storage's errors (OSError,
    botocore's), which leave the ledger unpruned."""
    storage = storages[ARCHIVE]
    ranges = {shard: (part.first, part.through) for shard, part in plan.items()}
    name = (f"audit-ledger-{plan[0].first:012d}-{plan[0].through:012d}" if set(plan) == {0}
            else f"audit-ledger-{now():%Y%m%dT%H%M%S%f}-{len(plan)}-shards")
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / f"{name}.jsonl"
        result = export_range(start=_EPOCH, end=now(), fmt="jsonl", path=path, sequences=ranges)
        manifest = result.manifest
        parts = manifest.get("shards") or {"0": {"count": manifest["count"],
                                                 "last_sequence": manifest["last_sequence"]}}
        exported = {int(shard): (part["count"], part["last_sequence"]) for shard, part in parts.items()}
        expected = {shard: (part.count, part.through) for shard, part in plan.items()}
        if exported != expected:
            raise OSError(f"the archive export holds (count, last sequence) {exported} per shard, "
                          f"not {expected}")
        names = []
        for written in (result.path, result.manifest_path):
            with written.open("rb") as handle:
                names.append(storage.save(f"pruned/{written.name}", File(handle, name=written.name)))
    return names[0]


def retention_cutoff(days: int | None = None) -> datetime | None:
    """`now - AUDIT_RETENTION_DAYS` (or `days`); None when retention is unlimited."""
    days = days if days is not None else getattr(settings, "AUDIT_RETENTION_DAYS", None)
    return None if days is None else now() - timedelta(days=int(days))


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class _deletes_allowed:
    """Open the DELETE guard for the rest of this transaction's prune (see migration 0001)."""

    def __enter__(self):
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SET LOCAL stepwise.audit_prune = 'on'")
            else:
                cursor.execute("DROP TRIGGER audit_entry_no_delete")

    def __exit__(self, *exc):
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SET LOCAL stepwise.audit_prune = 'off'")
            else:
                cursor.execute(SQLITE_NO_DELETE)
        return False
