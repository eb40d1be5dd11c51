"""The ledger API (/api/v1/ledger/): an auditor pages through a run's entries and exports them
with a manifest whose signed checkpoint vouches for them; a member, an editor, a reviewer and an
operator are refused; a verification is started and followed through the API, and the next one
walks only what is new since the last verified checkpoint."""
import csv
import hashlib
import io
import json

import pytest
from django.core.management import call_command

from audit import chain
from audit.anchoring import Checkpoint
from audit.models import CheckpointRecord, LedgerExport, LedgerVerification
from audit.signing import trusted_keys
from audit.tasks import export, verify
from orchestrator.celery import app as celery_app
from tests.api.published import assert_documented
from tests.conftest import client_for

from .conftest import ledger, tamper
from .test_anchoring import record

pytestmark = pytest.mark.django_db
ENTRIES = "/api/v1/ledger/entries/"
EXPORT = "/api/v1/ledger/entries/export/"
MANIFEST = "/api/v1/ledger/entries/manifest/"
STATUS = "/api/v1/ledger/status/"
VERIFICATIONS = "/api/v1/ledger/verifications/"
EXPORTS = "/api/v1/ledger/exports/"


def body(response) -> bytes:
    return b"".join(response.streaming_content)


def test_an_auditor_pages_through_a_runs_entries_newest_or_oldest_first(auditor, support_run):
    api = client_for(auditor)
    expected = [e.sequence for e in ledger(run_id=support_run.id)]
    assert len(expected) > 10

    seen, url = [], f"{ENTRIES}?run={support_run.id}&limit=4&order=oldest"
    while url:
        response = api.get(url)
        assert response.status_code == 200, response.content
        page = response.json()
        assert len(page["results"]) <= 4
        seen += [entry["sequence"] for entry in page["results"]]
        url = page["next"]
    assert seen == expected

    newest = api.get(f"{ENTRIES}?run={support_run.id}&limit=3").json()
    assert [e["sequence"] for e in newest["results"]] == expected[::-1][:3]
    # The next page is the same whatever is appended meanwhile (keyset, not offset).
    record(3)
    following = api.get(f"{ENTRIES}?run={support_run.id}&limit=3&cursor={newest['next_cursor']}").json()
    assert [e["sequence"] for e in following["results"]] == expected[::-1][3:6]

    completed = api.get(f"{ENTRIES}?run={support_run.id}&kind=step.completed&order=oldest").json()["results"]
    assert completed and {e["action"] for e in completed} == {"step.completed"}
    steps = api.get(f"{ENTRIES}?run={support_run.id}&kind=step&limit=500").json()["results"]
    assert {e["action"].split(".")[0] for e in steps} == {"step"}
    by_actor = api.get(f"{ENTRIES}?actor=user:approver&team=support&limit=500").json()["results"]
    assert by_actor and {(e["actor"], e["team"]) for e in by_actor} == {("user:approver", "support")}
    later = api.get(f"{ENTRIES}?run={support_run.id}&since=2999-01-01T00:00:00Z").json()
    assert later == {"results": [], "next_cursor": None, "next": None}

    # What a page holds is what the digest and hash were computed on.
    entry = completed[0]
    assert chain.content_digest(entry) == entry["digest"]
    assert chain.link_hash(entry["prev_hash"], entry["sequence"], entry["digest"]) == entry["hash"]


def test_a_page_matches_the_published_schema_and_a_bad_cursor_is_a_400(auditor, support_run):
    api = client_for(auditor)
    response = api.get(f"{ENTRIES}?run={support_run.id}&limit=2")
    assert_documented(api, response, "GET", ENTRIES)
    oldest_cursor = api.get(f"{ENTRIES}?run={support_run.id}&limit=2&order=oldest").json()["next_cursor"]
    for cursor in ("not-a-cursor", oldest_cursor):  # the other order's cursor is refused too
        refused = api.get(f"{ENTRIES}?run={support_run.id}&cursor={cursor}")
        assert refused.status_code == 400 and refused.json()["errors"][0]["path"] == "cursor"
        assert_documented(api, refused, "GET", ENTRIES)


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_an_auditor_exports_a_runs_entries_with_a_manifest_signed_through_them(auditor, support_run, fmt):
    api = client_for(auditor)
    assert api.get(f"{EXPORT}?run={support_run.id}").status_code == 409  # no checkpoint yet
    call_command("audit_checkpoint")
    record(2)  # newer than the checkpoint: not exported until the next one

    response = api.get(f"{EXPORT}?run={support_run.id}&file_format={fmt}")
    assert response.status_code == 200
    assert response["Content-Type"].startswith({"jsonl": "application/x-ndjson", "csv": "text/csv"}[fmt])
    through = int(response["X-Ledger-Through-Sequence"])
    content = body(response)
    rows = ([json.loads(line) for line in content.decode().splitlines()] if fmt == "jsonl"
            else list(csv.DictReader(io.StringIO(content.decode()))))
    expected = ledger(run_id=support_run.id)
    assert [int(row["sequence"]) for row in rows] == [e.sequence for e in expected]
    assert all(int(row["sequence"]) <= through for row in rows)

    manifest = api.get(f"{MANIFEST}?run={support_run.id}&file_format={fmt}&through={through}")
    assert manifest.status_code == 200
    manifest = manifest.json()
    assert manifest["file_sha256"] == hashlib.sha256(content).hexdigest()
    assert manifest["count"] == len(rows) and manifest["through_sequence"] == through
    assert manifest["selection"] == {"run": str(support_run.id)}
    checkpoint = Checkpoint.from_document(manifest["checkpoint"])
    assert checkpoint.problem(trusted_keys()) is None and checkpoint.sequence >= through
    assert_documented(api, api.get(f"{MANIFEST}?through={through}"), "GET", MANIFEST)

    exported = ledger(action="audit.exported")[-1]
    assert exported.actor == "user:auditor"
    assert exported.data == {"format": fmt, "through_sequence": through,
                             "selection": {"run": str(support_run.id)}}


@pytest.mark.parametrize("who", ["requester", "approver", "operator"])
@pytest.mark.parametrize("method,url", [
    ("get", ENTRIES), ("get", EXPORT), ("get", f"{MANIFEST}?through=1"), ("get", STATUS),
    ("post", VERIFICATIONS), ("post", EXPORTS)])
def test_a_member_editor_reviewer_or_operator_is_refused(request, support_run, who, method, url):
    call_command("audit_checkpoint")
    api = client_for(request.getfixturevalue(who))
    response = getattr(api, method)(url, {}, format="json") if method == "post" else api.get(url)
    assert response.status_code == 403, response.content
    assert "auditors and superusers" in response.json()["errors"][0]["message"]
    assert not LedgerVerification.objects.exists() and not LedgerExport.objects.exists()


@pytest.fixture
def sent(monkeypatch):
    """The tasks sent after commit (name, args, queue), which the test runs as the audit worker."""
    tasks = []
    monkeypatch.setattr(celery_app, "send_task", lambda name, args=None, kwargs=None, **options:
                        tasks.append((name, args, options.get("queue"))))
    return tasks


def test_an_auditor_verifies_through_the_api_then_only_what_is_new(
        auditor, sent, settings, django_capture_on_commit_callbacks, monkeypatch):
    # Entries earlier tests committed outlive their flush on PostgreSQL: no checkpoint of
    # theirs is in this test's directory.
    settings.AUDIT_CHECKPOINT_GRACE_S = 10**9
    api = client_for(auditor)
    record(5)
    call_command("audit_checkpoint")
    assert api.get(STATUS).json()["last_verified"] is None

    with django_capture_on_commit_callbacks(execute=True):
        started = api.post(VERIFICATIONS, {}, format="json")
    assert started.status_code == 202 and started.json()["state"] == "queued"
    assert_documented(api, started, "POST", VERIFICATIONS)
    full = LedgerVerification.objects.get()
    assert sent == [("audit.tasks.verify", [full.pk], "audit")]
    verify(full.pk)  # what the audit worker runs

    shown = api.get(started.json()["url"]).json()
    head = chain.chain_head()
    assert shown["state"] == "passed" and shown["mode"] == "full"
    assert (shown["through_sequence"], shown["through_hash"]) == head
    assert shown["entries_checked"] == shown["entries_total"] == head[0] - shown["from_sequence"] + 1
    status = api.get(STATUS).json()
    assert status["last_verified"]["id"] == full.pk and status["head_sequence"] == head[0]
    checkpoint = CheckpointRecord.objects.get()  # of the head before the request's entry
    assert status["last_checkpoint"]["sequence"] == checkpoint.sequence == head[0] - 1
    assert status["failures"] == []

    record(7)
    walked = []
    monkeypatch.setattr(chain, "verify_rows", _counting(chain.verify_rows, walked))
    with django_capture_on_commit_callbacks(execute=True):
        again = api.post(VERIFICATIONS, {"incremental": True}, format="json").json()
    verify(again["id"])
    shown = api.get(again["url"]).json()
    assert shown["state"] == "passed" and shown["mode"] == "incremental", shown["result"]
    # Only what follows the checkpoint the full verification covered is walked.
    new = chain.chain_head()[0] - checkpoint.sequence
    assert new == 9  # the first request's entry, the 7 recorded, the second request's
    assert walked == [new] and shown["entries_checked"] == shown["entries_total"] == new
    assert shown["from_sequence"] == checkpoint.sequence + 1
    assert shown["through_sequence"] == chain.chain_head()[0]
    assert shown["base_checkpoint"] == checkpoint.name
    assert "incremental, from the checkpoint at sequence" in shown["result"]


def test_an_incremental_verification_still_finds_a_break_in_what_is_new(
        auditor, sent, settings, django_capture_on_commit_callbacks):
    settings.AUDIT_CHECKPOINT_GRACE_S = 10**9
    api = client_for(auditor)
    record(3)
    call_command("audit_checkpoint")
    with django_capture_on_commit_callbacks(execute=True):
        first = api.post(VERIFICATIONS, {}, format="json").json()
    verify(first["id"])
    new = record(4)
    tamper("UPDATE audit_entry SET actor = 'user:mallory' WHERE id = %s", [new[1].id])
    with django_capture_on_commit_callbacks(execute=True):
        again = api.post(VERIFICATIONS, {"incremental": True}, format="json").json()
    verify(again["id"])
    shown = api.get(again["url"]).json()
    assert shown["state"] == "failed" and shown["mode"] == "incremental"
    assert f"BROKEN at sequence {new[1].sequence}" in shown["result"]
    assert api.get(STATUS).json()["failures"][0]["id"] == again["id"]


def test_without_a_verified_checkpoint_an_incremental_verification_walks_everything(
        auditor, sent, settings, django_capture_on_commit_callbacks):
    settings.AUDIT_CHECKPOINT_GRACE_S = 10**9
    api = client_for(auditor)
    record(2)
    with django_capture_on_commit_callbacks(execute=True):
        asked = api.post(VERIFICATIONS, {"incremental": True}, format="json").json()
    verify(asked["id"])
    shown = api.get(asked["url"]).json()
    assert shown["state"] == "passed" and shown["mode"] == "full"
    assert any("walked the whole chain" in warning for warning in shown["warnings"])


def _counting(verify_rows, walked):
    def spy(rows, **kwargs):
        rows = list(rows)
        walked.append(len(rows))
        return verify_rows(iter(rows), **kwargs)
    return spy


def test_the_admins_verify_ledger_asks_for_an_incremental_verification(client, auditor, sent):
    client.force_login(auditor)
    assert 'name="incremental"' in client.get("/admin/audit/auditentry/").content.decode()
    response = client.post("/admin/audit/ledgerverification/verify/", {"incremental": "1"})
    verification = LedgerVerification.objects.get()
    assert response.status_code == 302 and verification.mode == "incremental"
    assert ledger(action="audit.verification_requested")[-1].data["mode"] == "incremental"
    verify(verification.pk)  # no verified checkpoint yet: it walks everything, and says so
    page = client.get(response["Location"]).content.decode().lower()
    assert "passed" in page and "through sequence" in page and "walked the whole chain" in page


def test_audit_verify_incremental_starts_after_the_last_verified_checkpoint(
        auditor, sent, settings, django_capture_on_commit_callbacks, capsys):
    settings.AUDIT_CHECKPOINT_GRACE_S = 10**9
    record(3)
    call_command("audit_checkpoint")
    with django_capture_on_commit_callbacks(execute=True):
        first = client_for(auditor).post(VERIFICATIONS, {}, format="json").json()
    verify(first["id"])
    record(2)
    capsys.readouterr()
    call_command("audit_verify", "--incremental")
    checkpoint = CheckpointRecord.objects.get()
    assert (f"OK (incremental, from the checkpoint at sequence {checkpoint.sequence}), "
            f"{chain.chain_head()[0] - checkpoint.sequence} new entries") in capsys.readouterr().out


def test_an_auditor_exports_the_whole_ledger_on_the_audit_worker_and_downloads_it(
        auditor, member, sent, settings, tmp_path, django_capture_on_commit_callbacks, capsys):
    settings.STORAGES = {**settings.STORAGES, "artifacts": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": tmp_path / "shared"}}}
    api = client_for(auditor)
    record(3)
    with django_capture_on_commit_callbacks(execute=True):
        started = api.post(EXPORTS, {"format": "csv"}, format="json")
    assert started.status_code == 202 and started.json()["file_url"] is None
    assert_documented(api, started, "POST", EXPORTS)
    job = LedgerExport.objects.get()
    assert sent == [("audit.tasks.export", [job.pk], "audit")]
    early = api.get(f"{EXPORTS}{job.pk}/file/")
    assert early.status_code == 409  # not done yet

    export(job.pk)  # what the audit worker runs
    shown = api.get(started.json()["url"]).json()
    assert shown["state"] == "done" and shown["format"] == "csv"
    data = b"".join(api.get(shown["file_url"]).streaming_content)
    manifest = b"".join(api.get(shown["manifest_url"]).streaming_content)
    name = LedgerExport.objects.get().file.rsplit("/", 1)[-1]
    (tmp_path / name).write_bytes(data)
    (tmp_path / f"{name}.manifest.json").write_bytes(manifest)
    call_command("audit_verify", "--export", str(tmp_path / name))
    assert f"OK, {shown['entries']} entries" in capsys.readouterr().out
    refused = client_for(member).get(shown["file_url"])
    assert refused.status_code == 403
