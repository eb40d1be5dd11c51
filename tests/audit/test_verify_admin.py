"""The auditor's *Verify ledger* in the admin: asked for by an auditor or a superuser (the service
decides, a member is refused), run by the task on the `audit` queue, its row updated as it goes,
and its page reloading until the result is there, with its time."""
import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from audit import chain
from audit.models import LedgerVerification
from audit.tasks import verify
from audit.verification import ledger_verification_request, ledger_verification_run
from orchestrator.celery import app as celery_app
from orchestrator.engine.errors import Forbidden

from .conftest import ledger
from .test_anchoring import checkpoint_files, record, rewrite_and_rechain

pytestmark = pytest.mark.django_db
VERIFY = "/admin/audit/ledgerverification/verify/"
LEDGER = "/admin/audit/auditentry/"


def page(verification: LedgerVerification) -> str:
    return f"/admin/audit/ledgerverification/{verification.pk}/change/"


@pytest.fixture
def ask(client, django_capture_on_commit_callbacks, monkeypatch):
    """POST *Verify ledger* as `user`; returns the response and the tasks sent after commit
    (name, args, queue), which the test then runs as the audit worker would."""
    def post(user, **form):
        sent = []
        monkeypatch.setattr(celery_app, "send_task", lambda name, args=None, kwargs=None, **options:
                            sent.append((name, args, options.get("queue"))))
        client.force_login(user)
        with django_capture_on_commit_callbacks(execute=True):
            response = client.post(VERIFY, form)
        return response, sent
    return post


def test_an_auditor_verifies_the_ledger_from_the_admin_and_follows_its_progress(
        client, auditor, ask, monkeypatch, settings):
    # Entries earlier tests committed outlive their flush on PostgreSQL, and no checkpoint of
    # theirs is in this test's directory: this test is about the page, not the anchor.
    settings.AUDIT_CHECKPOINT_GRACE_S = 10**9
    record(5)
    client.force_login(auditor)
    assert "Verify ledger" in client.get(LEDGER).content.decode()

    response, sent = ask(auditor)
    verification = LedgerVerification.objects.get()
    assert response.status_code == 302 and response["Location"] == page(verification)
    # The task, sent to the audit queue once the request committed.
    assert sent == [("audit.tasks.verify", [verification.pk], "audit")]
    requested = ledger(action="audit.verification_requested")[-1]
    assert requested.actor == "user:auditor" and requested.data["verification"] == verification.pk

    shown = client.get(page(verification)).content.decode()
    assert "waiting for the audit worker" in shown and 'http-equiv="refresh"' in shown

    # Pages of two entries: the row is updated after each, and the page shows it.
    monkeypatch.setattr(chain, "PROGRESS_EVERY", 2)
    seen = []

    def progress_seen(count):
        row = LedgerVerification.objects.get(pk=verification.pk)
        seen.append((row.state, row.entries_checked, row.entries_total, row.stage))
        if count == 4:
            seen.append(client.get(page(verification)).content.decode())

    monkeypatch.setattr(chain, "verify_rows", _spying(chain.verify_rows, progress_seen))
    verify(verification.pk)  # what the audit worker runs

    total = chain.chain_head()[0]
    assert seen[0] == ("running", 0, total, "walking the chain")
    assert ("running", 2, total, "walking the chain") in seen
    halfway = next(text for text in seen if isinstance(text, str))
    assert f"2 of {total} entries" in halfway and 'http-equiv="refresh"' in halfway

    verification.refresh_from_db()
    assert verification.state == "passed" and verification.entries_checked == total
    assert verification.result.startswith(f"audit ledger: OK, {total} entries")
    assert verification.started_at <= verification.finished_at
    shown = client.get(page(verification)).content.decode()
    assert "passed" in shown and "audit ledger: OK" in shown and 'http-equiv="refresh"' not in shown


def _spying(verify_rows, seen):
    """verify_rows, reporting what the row says before each page it reads after the first."""
    def spy(rows, **kwargs):
        def watched():
            seen(0)
            for count, row in enumerate(rows, 1):
                yield row
                if count % chain.PROGRESS_EVERY == 0:
                    seen(count)
        return verify_rows(watched(), **kwargs)
    return spy


def test_a_verification_of_a_rewritten_ledger_fails_with_the_reason(
        client, auditor, ask):
    entries = record(3)
    call_command("audit_checkpoint")
    ask(auditor)
    rewrite_and_rechain(entries[1], actor="user:mallory")

    verification = LedgerVerification.objects.get()
    verify(verification.pk)
    verify(verification.pk)  # a replayed message leaves the finished result alone

    verification.refresh_from_db()
    assert verification.state == "failed" and "history was rewritten" in verification.result
    assert verification.finished_at is not None
    shown = client.get(page(verification)).content.decode()
    assert "failed" in shown and "history was rewritten" in shown


def test_an_auditor_may_accept_a_missing_checkpoint(client, auditor, ask):
    record(2)
    call_command("audit_checkpoint")
    checkpoint_files()[0].unlink()

    ask(auditor)
    ask(auditor, allow_missing_checkpoint="1")
    strict, accepting = LedgerVerification.objects.order_by("id")
    for verification in (strict, accepting):
        ledger_verification_run(verification_id=verification.pk)
        verification.refresh_from_db()
    assert strict.state == "failed" and "expected and missing" in strict.result
    assert accepting.state == "passed" and accepting.allow_missing_checkpoint
    assert "accepted (--allow-missing-checkpoint)" in accepting.warnings[0]


def test_a_verification_that_cannot_read_its_key_is_an_error_not_a_pass(
        client, auditor, ask, settings, tmp_path):
    record(1)
    call_command("audit_checkpoint")
    ask(auditor)
    settings.PRODUCTION, settings.AUDIT_SIGNING_KEY_FILE = True, str(tmp_path / "gone.pem")

    verification = ledger_verification_run(verification_id=LedgerVerification.objects.get().pk)
    assert verification.state == "error"
    assert verification.result.startswith("audit ledger: could not be checked: AUDIT_SIGNING_KEY_FILE")


def test_a_member_is_refused_by_the_service_and_nothing_is_asked(
        client, member, ask):
    response, sent = ask(member)
    assert response.status_code == 403 and sent == []
    assert not LedgerVerification.objects.exists()
    with pytest.raises(Forbidden, match="only auditors and superusers"):
        ledger_verification_request(actor=member)
    assert client.get("/admin/audit/ledgerverification/").status_code == 403


def test_a_non_staff_member_does_not_reach_it(client, requester, ask):
    response, sent = ask(requester)
    assert response.status_code == 302 and "/login/" in response["Location"]
    assert not LedgerVerification.objects.exists()


def test_a_superuser_may_verify(client, ask):
    root = User.objects.create_superuser("root", "root@example.com", "pw")
    response, sent = ask(root)
    assert response.status_code == 302 and len(sent) == 1
    assert LedgerVerification.objects.get().requested_by == root


def test_verify_is_a_post(client, auditor):
    client.force_login(auditor)
    assert client.get(VERIFY).status_code == 405


def test_the_verifications_list_opens_for_an_auditor_with_its_button(client, auditor, ask):
    ask(auditor)
    client.force_login(auditor)
    page = client.get("/admin/audit/ledgerverification/").content.decode()
    assert "Verify ledger" in page and "waiting for the audit worker" in page


def test_the_checkpoints_written_are_listed_for_an_auditor_and_hidden_from_a_member(
        client, auditor, member):
    record(1)
    call_command("audit_checkpoint")
    [name] = [path.name for path in checkpoint_files()]
    client.force_login(auditor)
    assert name in client.get("/admin/audit/checkpointrecord/").content.decode()
    client.force_login(member)
    assert client.get("/admin/audit/checkpointrecord/").status_code == 403


def test_a_verification_that_crashes_is_an_error_not_left_running(auditor, ask, monkeypatch):
    record(1)
    ask(auditor)

    def crash(**kwargs):
        raise RuntimeError("the database went away")

    monkeypatch.setattr(chain, "verify_rows", lambda rows, **kwargs: crash())
    with pytest.raises(RuntimeError):
        verify(LedgerVerification.objects.get().pk)
    verification = LedgerVerification.objects.get()
    assert verification.state == "error" and "RuntimeError: the database went away" in verification.result
