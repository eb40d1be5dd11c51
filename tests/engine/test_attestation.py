"""Attestation (docs/audit.md#attestation): every step's output is stored with a record its
producing process signed; the scheduler reads no output whose record does not verify against a
registered, unrevoked key, flags its step, pauses the run and raises an alert; `audit_verify`,
the run page and the audit timeline say the same. Runs are driven in this process through the
services a worker, the API and the reaper call (the real worker processes:
test_attestation_workers.py)."""
from decimal import Decimal

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management import CommandError, call_command
from django.utils import timezone

from alerts.detection import alerts_scan_events
from alerts.models import Alert
from audit.anchoring import checkpoint_write
from audit.models import AuditEntry, LedgerVerification
from audit.timeline import run_timeline
from audit.verification import ledger_check, outputs_check
from orchestrator.engine import attestation
from orchestrator.engine.attestation import (
    attestation_digest,
    attestation_problem,
    attestation_sign,
    process_key,
)
from orchestrator.engine.authz import label
from orchestrator.engine.errors import NotAllowed
from orchestrator.engine.services.attestations import (
    worker_key_provision,
    worker_key_register,
    worker_key_revoke,
)
from orchestrator.engine.services.kinds.worker import Usage, step_claim, step_succeed
from orchestrator.engine.services.operators import run_resume
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.signals import signal_send
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, Run, StepRun, WorkerKey
from orchestrator.web.progress import run_snapshot
from tests.factories import SETUP

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_keys(settings):
    """Each test reads key registrations afresh, as a process that just started would."""
    settings.STEPWISE_ATTESTATION_KEY_CACHE_S = 0
    settings.STEPWISE_ALERTS_SETTLE_S = 0
    attestation.keys_forget()
    yield
    attestation.keys_forget()


def order(team) -> Run:
    """`place` (a tool), then `pay` waits for signal `paid`, then `ship` reads both."""
    version, _ = workflow_save(team=team, actor=SETUP, definition={
        "name": "attested-order", "input_schema": {"type": "object"},
        "steps": [{"name": "place", "type": "tool", "tool": "core.echo", "params": {"x": 1}},
                  {"name": "pay", "type": "wait", "signal": "paid", "timeout_s": 60,
                   "after": ["place"]},
                  {"name": "ship", "type": "tool", "tool": "core.echo", "after": ["pay"],
                   "params": {"placed": "{{ steps.place.output.x }}"}}]})
    return run_start(version=version, input={}, actor=SETUP)


def finish(run: Run, name: str, output: dict, worker: str = "w1") -> StepRun:
    step = run.steps.get(name=name)
    claim = step_claim(step_id=step.id, worker=worker)
    assert step_succeed(step_id=step.id, attempt=claim.attempt, output=output,
                        usage=Usage(cost_usd=Decimal(0)), worker=worker)
    return StepRun.objects.get(id=step.id)


def states(run: Run) -> dict[str, str]:
    return dict(run.steps.values_list("name", "state"))


def pay(run: Run, requester) -> None:
    signal_send(run_id=run.id, name="paid", payload={"amount": 5}, key="k1", actor=requester)


# --- the record -------------------------------------------------------------------------------


def test_a_worker_success_stores_a_signed_record_of_the_attempt_beside_it_and_in_the_ledger(team):
    run = order(team)
    place = finish(run, "place", {"x": 1})

    record = place.attestation["record"]
    assert record["step"] == place.id and record["attempt"] == record["fencing_token"] == 1
    assert record["producer"] == "worker:w1"
    assert place.attestation["key"] == process_key().key_id
    assert place.attempt_records.get().attestation == place.attestation
    assert attestation_problem(step_id=place.id, output=place.output,
                               attestation=place.attestation) is None
    completed = AuditEntry.objects.get(run_id=run.id, step_name="place", action="step.completed")
    assert attestation_digest(place.attestation) in completed.payload


def test_every_completed_step_has_a_record_whoever_produced_it(team, requester):
    run = order(team)
    finish(run, "place", {"x": 1})
    pay(run, requester)  # the wait step's output: the signal, completed by this (web) process
    finish(run, "ship", {"shipped": True})

    assert Run.objects.get(id=run.id).state == "completed"
    steps = {s.name: s for s in run.steps.all()}
    assert steps["pay"].attestation["record"]["producer"] == label(requester)
    assert all(s.attestation for s in steps.values())
    assert outputs_check(run_id=run.id) == []
    assert Event.objects.filter(run=run, step=steps["pay"], kind="step.attested").count() == 1


@pytest.mark.parametrize(("tamper", "problem"), [
    (lambda a, o: (a, {**o, "x": 2}), "the output does not match its attestation"),
    (lambda a, o: ({**a, "record": {**a["record"], "output": "0" * 64}}, o),
     "the signature does not verify"),
    (lambda a, o: ({**a, "record": {**a["record"], "step": 0}}, o), "the attestation is of step 0"),
    (lambda a, o: (None, o), "no attestation"),
    (lambda a, o: ({"record": a["record"]}, o), "malformed attestation"),
])
def test_a_record_holds_only_for_the_output_and_step_it_was_signed_for(team, tamper, problem):
    run = order(team)
    place = finish(run, "place", {"x": 1})
    changed, output = tamper(place.attestation, place.output)

    found = attestation_problem(step_id=place.id, output=output, attestation=changed)

    assert found is not None and found.startswith(problem), found


def test_a_record_signed_by_an_unregistered_or_revoked_key_does_not_hold(team):
    stranger = attestation.ProcessKey(Ed25519PrivateKey.generate(), "", "", "generated")
    public = stranger.private.public_key()
    stranger = attestation.ProcessKey(stranger.private, attestation.key_id_of(public),
                                      attestation.public_text_of(public), "generated")
    signed = attestation_sign({"step": 7, "output": attestation.output_digest({"a": 1})}, key=stranger)
    assert "not registered" in attestation_problem(step_id=7, output={"a": 1}, attestation=signed)

    assert worker_key_register(key=stranger, process="elsewhere:1")
    assert attestation_problem(step_id=7, output={"a": 1}, attestation=signed) is None
    assert worker_key_revoke(actor=SETUP, key_id=stranger.key_id, reason="host retired")
    assert "revoked" in attestation_problem(step_id=7, output={"a": 1}, attestation=signed)
    assert not worker_key_register(key=stranger, process="elsewhere:1")  # revoked stays revoked
    actions = set(AuditEntry.objects.filter(subject_id=stranger.key_id).values_list("action", flat=True))
    assert actions == {"attestation_key.registered", "attestation_key.revoked"}


# --- the scheduler's check --------------------------------------------------------------------


def test_an_output_edited_in_the_database_pauses_the_run_whose_next_step_would_read_it(
        team, requester):
    run = order(team)
    finish(run, "place", {"x": 1})
    StepRun.objects.filter(run=run, name="place").update(output={"x": 999})  # behind our back

    pay(run, requester)  # `ship` would now be ready, with `place`'s output in its input

    run.refresh_from_db()
    assert run.state == "paused"
    assert run.error["class"] == "attestation" and "place" in run.error["steps"]
    assert states(run)["ship"] == "blocked"
    [flag] = Event.objects.filter(run=run, kind="step.attestation_invalid")
    assert flag.step.name == "place"
    assert flag.payload["problem"].startswith("the output does not match its attestation")
    assert flag.payload["producer"] == "worker:w1"

    alerts_scan_events()
    alert = Alert.objects.get(run=run, rule="step.attestation_invalid")
    assert "place" in alert.subject and alert.severity == "critical"

    # An operator resuming the run without repairing the output changes nothing.
    run_resume(run_id=run.id, actor=SETUP)
    run.refresh_from_db()
    assert run.state == "paused" and states(run)["ship"] == "blocked"


def test_the_run_page_audit_verify_and_the_timeline_flag_an_edited_output(team, requester, settings):
    run = order(team)
    finish(run, "place", {"x": 1})
    snapshot = {s["name"]: s for s in run_snapshot(Run.objects.get(id=run.id))["steps"]}
    assert snapshot["place"]["attestation"] == {
        "producer": "worker:w1", "key": process_key().key_id, "ok": True, "problem": ""}
    story = {s.name: s for s in run_timeline(run.id).steps}["place"]
    assert story.produced.startswith("produced by worker w1, signed")

    StepRun.objects.filter(run=run, name="place").update(output={"x": 999})

    snapshot = {s["name"]: s for s in run_snapshot(Run.objects.get(id=run.id))["steps"]}
    assert snapshot["place"]["attestation"]["ok"] is False
    assert "does not match" in snapshot["place"]["attestation"]["problem"]
    with pytest.raises(CommandError, match=r"1 step output\(s\) fail their attestation: .*'place'"):
        call_command("audit_verify", "--allow-missing-checkpoint")


def test_an_incremental_check_reads_the_outputs_of_the_steps_its_new_entries_complete(team):
    """Verification in time proportional to what is new: an incremental verification checks the
    outputs of the steps whose completion the entries after its checkpoint record; a full one,
    every step's."""
    old, new = order(team), order(team)
    finish(old, "place", {"x": 1})
    checkpoint = checkpoint_write(reason="test")
    LedgerVerification.objects.create(
        requested_by_label="test", created_at=timezone.now(), state=LedgerVerification.State.PASSED,
        from_sequence=1, through_sequence=checkpoint.sequence, through_hash=checkpoint.hash)
    finish(new, "place", {"x": 1})
    StepRun.objects.filter(run__in=[old, new], name="place").update(output={"x": 999})

    incremental = ledger_check(incremental=True, allow_missing_checkpoint=True)
    full = ledger_check(allow_missing_checkpoint=True)

    assert incremental.mode == "incremental", incremental.message
    assert "1 step output(s) fail" in incremental.message and str(new.id) in incremental.message
    assert "2 step output(s) fail" in full.message
    assert len(outputs_check()) == 2


def test_a_record_removed_from_the_database_is_flagged_like_an_edited_output(team, requester):
    run = order(team)
    finish(run, "place", {"x": 1})
    StepRun.objects.filter(run=run, name="place").update(attestation=None)

    pay(run, requester)

    run.refresh_from_db()
    assert run.state == "paused" and states(run)["ship"] == "blocked"
    assert run.error["steps"]["place"].startswith("no attestation")


def test_a_step_signed_by_a_revoked_key_cannot_advance_its_run(team, requester):
    run = order(team)
    finish(run, "place", {"x": 1})
    worker_key_revoke(actor=SETUP, key_id=process_key().key_id, reason="worker compromised")

    pay(run, requester)

    run.refresh_from_db()
    assert run.state == "paused" and states(run)["ship"] == "blocked"
    assert "revoked" in run.error["steps"]["place"]


# --- keys -------------------------------------------------------------------------------------


def test_a_deployment_of_provisioned_keys_refuses_a_new_key_until_an_operator_adds_it(settings):
    settings.STEPWISE_ATTESTATION_PROVISIONED_ONLY = True
    private = Ed25519PrivateKey.generate()
    public = private.public_key()
    key = attestation.ProcessKey(private, attestation.key_id_of(public),
                                 attestation.public_text_of(public), "env")

    assert not worker_key_register(key=key, process="w9:1")
    assert not WorkerKey.objects.filter(key_id=key.key_id).exists()

    worker_key_provision(actor=SETUP, public_key=key.public_text, process="w9")
    assert worker_key_register(key=key, process="w9:1")
    row = WorkerKey.objects.get(key_id=key.key_id)
    assert row.provisioned and row.revoked_at is None


def test_only_a_superuser_or_the_system_manages_keys(team, operator, django_user_model):
    with pytest.raises(NotAllowed):
        worker_key_revoke(actor=operator, key_id=process_key().key_id)
    root = django_user_model.objects.create_superuser("root", "root@example.com", "x")
    worker_key_register()
    assert worker_key_revoke(actor=root, key_id=process_key().key_id)


def test_an_operator_generates_provisions_lists_and_revokes_a_key_from_the_command_line(tmp_path, capsys):
    pem = tmp_path / "worker-1.pem"
    call_command("attestation_keys", "keygen", "--output", str(pem))
    key_id, public = capsys.readouterr().out.split()
    assert pem.stat().st_mode & 0o777 == 0o600
    with pytest.raises(CommandError, match="not overwritten"):
        call_command("attestation_keys", "keygen", "--output", str(pem))

    call_command("attestation_keys", "provision", public, "--process", "worker-1")
    call_command("attestation_keys", "revoke", key_id, "--reason", "rotated")
    call_command("attestation_keys", "list")

    listed = capsys.readouterr().out
    assert f"{key_id}  worker-1" in listed and "(provisioned)" in listed and "revoked" in listed
    row = WorkerKey.objects.get(key_id=key_id)
    assert row.provisioned and row.revoked_by == "service:attestation-keys"
    with pytest.raises(CommandError, match="no such active key"):
        call_command("attestation_keys", "revoke", key_id)
