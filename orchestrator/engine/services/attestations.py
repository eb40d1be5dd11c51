"""The deployment's attestation keys, and the records of outputs no worker produced.

A process registers its key as it starts signing (`worker_key_register`, once per process): a key
seen for the first time is added, unless the deployment takes provisioned keys only
(STEPWISE_ATTESTATION_PROVISIONED_ONLY), in which case only a key an operator added first
(`worker_key_provision`) is accepted. An operator revokes a key (`worker_key_revoke`): from then
on no output it signed lets a run advance. Each change is an entry of the audit ledger.

`output_attest` signs the record of an output that is not a worker's attempt (a gate's decision,
a sleep's wake, a child run's output, a map's join, a fork's carried step): the process whose
transaction completes the step signs it, at the one place every step's end passes
(`step_end.step_ended`). Keys are deployment-wide, so only a superuser or a named system actor (a
management command) changes them.

`Trace` is what a worker's attempt (or a map item's) signs: each external call it was authorized
to make, with the hash of its request and of what answered it — per model route tried, that
route's request and reply or error — and the route that answered.
"""
import logging
import os
from collections.abc import Callable

from django.conf import settings
from django.db import IntegrityError, transaction

from audit.services import audit_record, external_call_authorize
from orchestrator.models import Run, StepRun, WorkerKey

from ..attestation import (
    ProcessKey,
    attestation_digest,
    attestation_sign,
    key_id_of,
    keys_forget,
    output_digest,
    process_key,
    process_label,
    public_key_of,
    public_text_of,
    request_digest,
)
from ..authz import Actor, System, label
from ..clock import now
from ..errors import NotAllowed
from ..events import event_record
from ..hashing import digest_of
from ..selectors import spec_of, step_input_of

log = logging.getLogger(__name__)

# The pid whose key is registered (a forked child registers its own).
_registered_in: int | None = None


def _may_manage_keys(actor: Actor) -> None:
    if isinstance(actor, System):
        return
    if getattr(actor, "is_authenticated", False) and actor.is_superuser:
        return
    raise NotAllowed("only a superuser manages the deployment's attestation keys")


def worker_key_register(*, key: ProcessKey | None = None, process: str = "") -> bool:
    """Register this process's public key (or `key`). True when the key may sign: it is
    registered and not revoked. A new key is refused when the deployment takes provisioned keys
    only; a refused or revoked key still signs, and nothing it signs lets a run advance."""
    key = key or process_key()
    process = process or process_label()
    with transaction.atomic():
        row = WorkerKey.objects.filter(key_id=key.key_id).first()
        if row is not None:
            if not row.process:
                WorkerKey.objects.filter(key_id=key.key_id).update(process=process[:200])
            return row.revoked_at is None
        if settings.STEPWISE_ATTESTATION_PROVISIONED_ONLY:
            audit_record(action="attestation_key.refused", actor=f"worker:{process}",
                         subject_type="worker_key", subject_id=key.key_id, outcome="refused",
                         payload={"process": process, "reason": "not provisioned"})
            log.error("attestation key %s of %s is not provisioned: its outputs will not advance "
                      "any run", key.key_id, process)
            return False
        try:
            with transaction.atomic():
                WorkerKey.objects.create(key_id=key.key_id, public_key=key.public_text,
                                         process=process[:200])
        except IntegrityError:
            return True  # another thread of this process registered it a moment ago
        audit_record(action="attestation_key.registered", actor=f"worker:{process}",
                     subject_type="worker_key", subject_id=key.key_id, outcome="registered",
                     payload={"process": process, "public_key": key.public_text,
                              "source": key.source})
    return True


def key_registered() -> None:
    """Register this process's key, once per process, in the transaction that stores the first
    record it signs (or before)."""
    global _registered_in
    if _registered_in == os.getpid():
        return
    if WorkerKey.objects.filter(key_id=process_key().key_id).exists():
        _registered_in = os.getpid()  # registered before (provisioned, or by a former process)
        return
    worker_key_register()
    transaction.on_commit(_remember_registered)


def _remember_registered() -> None:
    global _registered_in
    _registered_in = os.getpid()


def worker_key_provision(*, actor: Actor, public_key: str, process: str = "") -> WorkerKey:
    """Add a public key before any process uses it (base64 of the raw 32 bytes). Raises
    NotAllowed for anyone but a superuser or a system actor, ValueError for a bad key."""
    _may_manage_keys(actor)
    public = public_key_of(public_key)
    key_id = key_id_of(public)
    with transaction.atomic():
        row, created = WorkerKey.objects.get_or_create(
            key_id=key_id, defaults={"public_key": public_text_of(public), "process": process[:200],
                                     "provisioned": True})
        if created:
            audit_record(action="attestation_key.provisioned", actor=label(actor),
                         subject_type="worker_key", subject_id=key_id, outcome="provisioned",
                         payload={"process": process, "public_key": row.public_key})
    return row


def worker_key_revoke(*, actor: Actor, key_id: str, reason: str = "") -> bool:
    """Revoke a key: what it signed no longer lets a run advance (within
    STEPWISE_ATTESTATION_KEY_CACHE_S in other processes). False if it is unknown or was revoked
    already. Raises NotAllowed for anyone but a superuser or a system actor."""
    _may_manage_keys(actor)
    with transaction.atomic():
        changed = WorkerKey.objects.filter(key_id=key_id, revoked_at=None).update(
            revoked_at=now(), revoked_by=label(actor)[:200])
        if changed:
            audit_record(action="attestation_key.revoked", actor=label(actor),
                         subject_type="worker_key", subject_id=key_id, outcome="revoked",
                         payload={"reason": reason})
    keys_forget()
    return bool(changed)


def output_attest(run: Run, step: StepRun, *, producer: str,
                  record: Callable[..., None] | None = None) -> dict:
    """Sign the record of `step`'s output as this process produced it (a completion no worker
    attempt made: see the module's docstring), and set it on the step (the caller saves it).
    Its hash goes into the ledger as `step.attested`: through `record(step, kind, payload)` when
    the caller batches its events, else at once."""
    key_registered()
    step.attestation = attestation_sign({
        "step": step.id,
        "run": str(run.id),
        "name": step.name,
        "kind": step.kind,
        "attempt": step.attempts,
        "fencing_token": step.attempts,
        "producer": producer,
        "input": digest_of(step_input_of(step) if "input" in step.get_deferred_fields()
                           else step.input),
        "spec": _spec_digest(run, step),
        "calls": [],
        "route": "",
        "output": output_digest(step.output),
    })
    payload = {"producer": producer, "key": step.attestation["key"],
               "attestation": attestation_digest(step.attestation)}
    if record is not None:
        record(step, "step.attested", payload)
    else:
        event_record(run=run, step=step, kind="step.attested", actor=producer, payload=payload)
    return step.attestation


def _spec_digest(run: Run, step: StepRun) -> str:
    try:
        return digest_of(spec_of(run, step.name))
    except KeyError:  # a loop's iteration of a body step not in the version's list: none
        return ""


class Trace:
    """What an attempt did, as its attestation records it: the claim it ran and each external
    call it was authorized to make (through its `ExecContext.authorize`, which every tool and
    model call passes before it is made), with what it answered (`ExecContext.responded`): a
    tool's response, and for a model call each route tried — the request that route was sent
    and its reply or error — and the route that answered."""

    __slots__ = ("claim", "calls")

    def __init__(self, claim) -> None:  # a worker kind's Claim, or None
        self.claim = claim
        self.calls: list[dict] = []

    def authorize(self, **call):
        entry = external_call_authorize(**call)
        self.calls.append({"kind": call.get("kind", ""), "target": call.get("target", ""),
                           "request": request_digest(call.get("request")),
                           "entry": getattr(entry, "pk", None)})
        return entry

    def responded(self, *, request, response, route: str = "", outcome: str = "answered") -> None:
        if not self.calls:  # an answer to no authorized call: recorded as a call of its own
            self.calls.append({"kind": "", "target": "", "request": request_digest(request),
                               "entry": None})
        call = self.calls[-1]
        answer = request_digest(response)
        if route:
            call.setdefault("routes", []).append({"route": route, "outcome": outcome,
                                                  "request": request_digest(request),
                                                  "response": answer})
        if outcome == "answered":
            call["response"] = answer
            if route:
                call["route"] = route

    def record(self, *, step_id: int, attempt: int, worker: str, output, usage) -> dict:
        """The attestation of this attempt's `output` (as stored: JSON), signed by this process.
        Without its claim (a result reported by a caller that ran nothing through
        `step_execute`), the record has no input, definition or call to name."""
        claim = self.claim
        route, route_model = answering_route(usage.meta, usage.provider, usage.model)
        return attestation_sign({
            "step": step_id,
            "run": str(claim.run_id) if claim else "",
            "name": claim.spec["name"] if claim else "",
            "kind": claim.spec["type"] if claim else "",
            "attempt": attempt,
            "fencing_token": attempt,
            "producer": f"worker:{worker}",
            "input": digest_of(claim.step_input) if claim else None,
            "spec": digest_of(claim.spec) if claim else None,
            "calls": self.calls,
            "route": route,
            "route_model": route_model,
            "reused_from": usage.meta.get("reused_from"),
            "output": output_digest(output),
        })


def answering_route(meta: dict, provider: str, model: str) -> tuple[str, str]:
    """(route, provider/model version) as an attestation names them: the gateway's route that
    answered last (StepAttempt.routes); without routes, the executor's provider/model."""
    answered = [r for r in meta.get("routes") or [] if r.get("outcome") == "answered"]
    if answered:
        return answered[-1]["route"], f"{answered[-1].get('provider', '')}/{answered[-1].get('model_id', '')}"
    return "/".join(p for p in (provider, model, str(meta.get("model_id") or "")) if p), ""
