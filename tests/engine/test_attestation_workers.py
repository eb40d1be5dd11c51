"""Attestation with real worker processes on the real broker and database: a worker signs each
attempt with its own key; an output edited in the database after it was produced, or one
signed by a key that is not registered (or revoked), does not let its run advance."""
import base64

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management import CommandError, call_command

from audit.models import AuditEntry
from orchestrator.engine.attestation import key_id_of, process_key, public_text_of
from orchestrator.engine.services.attestations import worker_key_provision, worker_key_revoke
from orchestrator.engine.services.operators import run_resume
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.signals import signal_send
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, Run, StepRun, WorkerKey
from orchestrator.web.progress import run_snapshot
from tests.factories import SETUP
from tests.integration.conftest import WorkerGroup, wait_for, wait_for_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CHAIN = {"name": "attested-chain", "input_schema": {"type": "object"}, "steps": [
    {"name": "first", "type": "tool", "tool": "core.echo", "params": {"n": 1}},
    {"name": "second", "type": "tool", "tool": "core.echo", "after": ["first"],
     "params": {"seen": "{{ steps.first.output.n }}"}}]}


def test_an_output_edited_in_the_database_is_flagged_and_its_run_pauses_on_real_workers(
        workers, team, requester, settings):
    settings.STEPWISE_ATTESTATION_KEY_CACHE_S = 0
    version, _ = workflow_save(team=team, actor=SETUP, definition={
        "name": "attested-order", "input_schema": {"type": "object"},
        "steps": [{"name": "place", "type": "tool", "tool": "core.echo", "params": {"x": 1}},
                  {"name": "pay", "type": "wait", "signal": "paid", "timeout_s": 120,
                   "after": ["place"]},
                  {"name": "ship", "type": "tool", "tool": "core.echo", "after": ["pay"],
                   "params": {"placed": "{{ steps.place.output.x }}"}}]})
    run = run_start(version=version, input={}, actor=SETUP)
    wait_for_run(run.id, states=("waiting",), timeout=60)
    place = StepRun.objects.get(run=run, name="place")
    # Signed in the worker process, with its own key, registered as it started signing.
    assert place.attestation["record"]["producer"].startswith("worker:")
    worker_key = WorkerKey.objects.get(key_id=place.attestation["key"])
    assert worker_key.key_id != process_key().key_id and worker_key.revoked_at is None
    assert {s["name"]: s["attestation"]["ok"] for s in run_snapshot(Run.objects.get(id=run.id))["steps"]
            if s["attestation"]} == {"place": True}

    StepRun.objects.filter(id=place.id).update(output={"x": 999})  # behind the engine's back

    signal_send(run_id=run.id, name="paid", payload={"amount": 5}, key="k1", actor=requester)
    run = wait_for_run(run.id, states=("paused", "completed", "failed"), timeout=60)
    assert run.state == "paused", run.error
    assert StepRun.objects.get(run=run, name="ship").state == "blocked"
    assert Event.objects.filter(run=run, step=place, kind="step.attestation_invalid").exists()
    page = {s["name"]: s for s in run_snapshot(Run.objects.get(id=run.id))["steps"]}
    assert page["place"]["attestation"]["ok"] is False
    with pytest.raises(CommandError, match="'place'.*does not match its attestation"):
        call_command("audit_verify", "--allow-missing-checkpoint")


def test_a_worker_key_not_provisioned_or_revoked_cannot_advance_a_run(team, settings):
    """A worker group provisioned with its key through the environment, in a deployment that
    takes provisioned keys only: until an operator adds its key, what it produces pauses the run;
    once added, the run goes on; once revoked, a new run pauses again."""
    settings.STEPWISE_ATTESTATION_KEY_CACHE_S = 0
    private = Ed25519PrivateKey.generate()
    raw = private.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                serialization.NoEncryption())
    key_id = key_id_of(private.public_key())
    group = WorkerGroup("attest-provisioned", env={
        "STEPWISE_ATTESTATION_KEY": base64.b64encode(raw).decode(),
        "STEPWISE_ATTESTATION_PROVISIONED_ONLY": "1",
        "STEPWISE_ATTESTATION_KEY_CACHE_S": "0"})
    version, _ = workflow_save(team=team, actor=SETUP, definition=CHAIN)
    group.start()
    try:
        run = run_start(version=version, input={}, actor=SETUP)
        run = wait_for_run(run.id, states=("paused", "completed", "failed"), timeout=60)
        assert run.state == "paused", run.error
        first = StepRun.objects.get(run=run, name="first")
        assert first.attestation["key"] == key_id
        assert "not registered" in run.error["steps"]["first"]
        assert StepRun.objects.get(run=run, name="second").state == "blocked"
        assert not WorkerKey.objects.filter(key_id=key_id).exists()
        assert AuditEntry.objects.filter(action="attestation_key.refused", subject_id=key_id).exists()

        worker_key_provision(actor=SETUP, public_key=public_text_of(private.public_key()),
                             process="attest-provisioned")
        run_resume(run_id=run.id, actor=SETUP)
        run = wait_for_run(run.id, states=("completed", "failed", "paused"), timeout=60)
        assert run.state == "completed", run.error
        assert StepRun.objects.get(run=run, name="second").attestation["key"] == key_id

        worker_key_revoke(actor=SETUP, key_id=key_id, reason="host retired")
        again = run_start(version=version, input={}, actor=SETUP)
        again = wait_for_run(again.id, states=("paused", "completed", "failed"), timeout=60)
        assert again.state == "paused" and "revoked" in again.error["steps"]["first"]
        wait_for(lambda: StepRun.objects.get(run=again, name="second").state == "blocked")
    finally:
        group.stop()
