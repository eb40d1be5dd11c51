"""The auditor's *Export ledger* in the admin: asked for by an auditor (the service decides, a
member is refused), written by the task on the `audit` queue into the shared storage with its
signed manifest, downloaded from the admin, and verifiable offline as `audit_export`'s are."""
import pytest
from django.core.management import call_command

from audit.models import LedgerExport
from audit.tasks import export
from audit.verification import ledger_export_open
from orchestrator.engine.errors import Forbidden

from .test_anchoring import record

pytestmark = pytest.mark.django_db
EXPORT = "/admin/audit/ledgerexport/export/"


@pytest.fixture
def shared_storage(settings, tmp_path):
    settings.STORAGES = {**settings.STORAGES, "artifacts": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": tmp_path / "shared"}}}
    return tmp_path / "shared"


def post_export(client, user, django_capture_on_commit_callbacks, monkeypatch, **form):
    from orchestrator.celery import app as celery_app
    sent = []
    monkeypatch.setattr(celery_app, "send_task", lambda name, args=None, kwargs=None, **options:
                        sent.append((name, args, options.get("queue"))))
    client.force_login(user)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(EXPORT, form)
    return response, sent


def test_an_auditor_exports_the_ledger_and_downloads_a_file_that_verifies_offline(
        client, auditor, shared_storage, django_capture_on_commit_callbacks, monkeypatch, tmp_path,
        capsys):
    entries = record(4)
    client.force_login(auditor)
    assert "Export ledger" in client.get("/admin/audit/auditentry/").content.decode()

    response, sent = post_export(client, auditor, django_capture_on_commit_callbacks, monkeypatch)
    job = LedgerExport.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/admin/audit/ledgerexport/{job.pk}/change/"
    assert sent == [("audit.tasks.export", [job.pk], "audit")]
    assert 'http-equiv="refresh"' in client.get(response["Location"]).content.decode()

    export(job.pk)  # what the audit worker runs
    job.refresh_from_db()
    assert job.state == "done" and job.entries >= len(entries)
    page = client.get(response["Location"]).content.decode()
    assert 'http-equiv="refresh"' not in page and "manifest" in page

    download = f"/admin/audit/ledgerexport/{job.pk}/download/"
    data = b"".join(client.get(download).streaming_content)
    manifest = b"".join(client.get(download + "?manifest=1").streaming_content)
    name = job.file.rsplit("/", 1)[-1]
    (tmp_path / name).write_bytes(data)
    (tmp_path / f"{name}.manifest.json").write_bytes(manifest)
    call_command("audit_verify", "--export", str(tmp_path / name))
    assert f"export {tmp_path / name}: OK, {job.entries} entries" in capsys.readouterr().out


def test_a_member_may_neither_export_nor_download(client, member, auditor, shared_storage,
                                                  django_capture_on_commit_callbacks, monkeypatch):
    record(1)
    response, sent = post_export(client, member, django_capture_on_commit_callbacks, monkeypatch)
    assert response.status_code == 403 and sent == [] and not LedgerExport.objects.exists()

    post_export(client, auditor, django_capture_on_commit_callbacks, monkeypatch, format="csv")
    job = LedgerExport.objects.get()
    client.force_login(auditor)
    assert client.get(f"/admin/audit/ledgerexport/{job.pk}/download/").status_code == 409
    export(job.pk)
    client.force_login(member)
    assert client.get(f"/admin/audit/ledgerexport/{job.pk}/download/").status_code == 403
    with pytest.raises(Forbidden):
        ledger_export_open(actor=member, export_id=job.pk)
