"""The audit worker as it runs: a real `celery worker` consuming the `audit` queue signs the head
when it starts, and runs the verification an auditor asks for in the admin, through the
filesystem broker and the test database."""
import json

import pytest
from django.contrib.auth.models import Group, User

from audit.chain import chain_head
from audit.models import CheckpointRecord, LedgerVerification
from orchestrator.celery import app as celery_app
from tests.integration.conftest import WorkerGroup, wait_for

from .test_anchoring import record

# The session's worker group, if an earlier file started it, is stopped meanwhile: a late step
# of an earlier test would record an entry after the checkpoint this test expects to match.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("without_workers")]


@pytest.fixture
def audit_worker(settings, audit_checkpoint_dir):
    # An earlier test in this process may have asked for an export or a verification that no
    # worker ran: its message, still on the `audit` queue, would sign a second checkpoint here.
    with celery_app.connection_for_write() as conn:
        conn.default_channel.queue_purge("audit")
    group = WorkerGroup("audit-checkpoints", queues="audit", env={
        "AUDIT_CHECKPOINT_DIR": str(audit_checkpoint_dir),
        "AUDIT_SIGNING_KEY_FILE": str(settings.AUDIT_SIGNING_KEY_FILE)})
    yield group
    group.stop()


def test_the_audit_worker_signs_the_head_at_start_and_runs_an_auditors_verification(
        audit_worker, audit_checkpoint_dir, client):
    record(3)
    head = chain_head()

    audit_worker.start()

    written = wait_for(lambda: CheckpointRecord.objects.filter(reason="start").first(), timeout=60)
    assert (written.sequence, written.hash) == head
    document = json.loads((audit_checkpoint_dir / written.name).read_text())
    assert (document["sequence"], document["hash"], document["reason"]) == (*head, "start")

    auditor = User.objects.create_user("auditor", is_staff=True)
    auditor.groups.add(Group.objects.get_or_create(name="auditors")[0])
    client.force_login(auditor)
    response = client.post("/admin/audit/ledgerverification/verify/")
    assert response.status_code == 302

    verification = wait_for(
        lambda: LedgerVerification.objects.filter(state__in=LedgerVerification.FINISHED).first(),
        timeout=60)
    assert verification.state == "passed", verification.result
    assert "matches 1 signed checkpoint(s)" in verification.result
    assert verification.started_at and verification.finished_at
    page = client.get(response["Location"]).content.decode()
    assert "passed" in page and 'http-equiv="refresh"' not in page
