"""Checkpoints in an S3-compatible bucket with object lock (AUDIT_CHECKPOINT_S3_BUCKET), against
a real local S3 server (moto in server mode): written there at start and on schedule, read
from there by `audit_verify`, and not removable by whoever holds the bucket's credentials."""
import json
import uuid
from dataclasses import dataclass

import boto3
import pytest
from botocore.exceptions import ClientError
from django.core.management import CommandError, call_command

from audit.models import CheckpointRecord
from audit.stores import StorageStore, checkpoint_store
from orchestrator.celery import app as celery_app
from tests.tools.conftest import s3_server  # noqa: F401  (the moto server fixture)

from .test_anchoring import record, rewrite_and_rechain

pytestmark = pytest.mark.django_db
PREFIX = "audit-checkpoints"


@dataclass
class Bucket:
    client: object  # boto3's S3 client
    name: str

    def keys(self) -> list[str]:
        listed = self.client.list_objects_v2(Bucket=self.name).get("Contents", [])
        return sorted(o["Key"] for o in listed)


@pytest.fixture
def bucket(s3_server, settings, monkeypatch, tmp_path) -> Bucket:  # noqa: F811
    """A bucket of this test's own, created with object lock and a default retention, as
    docs/audit.md tells the operator; the settings settings.py builds from
    AUDIT_CHECKPOINT_S3_* (with a retention per object as well)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    bucket = Bucket(boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1"),
                    f"checkpoints-{uuid.uuid4().hex[:12]}")
    bucket.client.create_bucket(Bucket=bucket.name, ObjectLockEnabledForBucket=True)
    bucket.client.put_object_lock_configuration(Bucket=bucket.name, ObjectLockConfiguration={
        "ObjectLockEnabled": "Enabled", "Rule": {"DefaultRetention": {"Mode": "COMPLIANCE", "Days": 1}}})
    settings.STORAGES = {**settings.STORAGES, "audit_checkpoints": {
        "BACKEND": "audit.s3.LockedS3Storage", "OPTIONS": {
            "bucket_name": bucket.name, "location": PREFIX, "endpoint_url": s3_server,
            "region_name": "us-east-1", "retain_days": 30, "lock_mode": "COMPLIANCE",
            "default_acl": None, "querystring_auth": False, "file_overwrite": True}}}
    settings.AUDIT_CHECKPOINT_DIR = tmp_path / "not-used"
    return bucket


def test_checkpoints_go_to_the_bucket_locked_and_audit_verify_reads_them_there(bucket, settings, capsys):
    store = checkpoint_store()
    assert isinstance(store, StorageStore) and store.describe() == f"bucket s3://{bucket.name}/{PREFIX}"
    entries = record(3)
    celery_app.loader.import_default_modules()
    celery_app.tasks["audit.tasks.checkpoint"](at_start=True)

    [key] = bucket.keys()
    assert key.startswith(f"{PREFIX}/checkpoint-{entries[-1].sequence:012d}-")
    document = json.loads(bucket.client.get_object(Bucket=bucket.name, Key=key)["Body"].read())
    assert (document["sequence"], document["hash"], document["reason"]) == (
        entries[-1].sequence, entries[-1].hash, "start")
    head = bucket.client.head_object(Bucket=bucket.name, Key=key)
    assert head["ObjectLockMode"] == "COMPLIANCE"
    assert (head["ObjectLockRetainUntilDate"] - entries[-1].created_at).days >= 29
    assert CheckpointRecord.objects.get().store == f"bucket s3://{bucket.name}/{PREFIX}"
    assert not (settings.AUDIT_CHECKPOINT_DIR).exists()

    call_command("audit_verify")
    assert "matches 1 signed checkpoint(s)" in capsys.readouterr().out
    rewrite_and_rechain(entries[1], actor="user:mallory")
    with pytest.raises(CommandError, match="history was rewritten"):
        call_command("audit_verify")


def test_a_checkpoint_cannot_be_deleted_from_the_bucket_and_hiding_it_fails_audit_verify(bucket):
    entries = record(2)
    call_command("audit_checkpoint")
    [key] = bucket.keys()
    [version] = bucket.client.list_object_versions(Bucket=bucket.name, Prefix=key)["Versions"]

    with pytest.raises(ClientError, match="AccessDenied"):
        bucket.client.delete_object(Bucket=bucket.name, Key=key, VersionId=version["VersionId"])

    # Deleting without a version only hides it behind a delete marker; the locked version
    # stays, to be restored. Hidden, it is a checkpoint expected and missing.
    rewrite_and_rechain(entries[0], outcome="approved")
    bucket.client.delete_object(Bucket=bucket.name, Key=key)
    assert bucket.keys() == []
    with pytest.raises(CommandError, match="a signed checkpoint is expected and missing") as caught:
        call_command("audit_verify")
    assert f"is missing from bucket s3://{bucket.name}/{PREFIX}" in str(caught.value)

    # The operator restores it by deleting the delete marker.
    [marker] = bucket.client.list_object_versions(Bucket=bucket.name, Prefix=key)["DeleteMarkers"]
    bucket.client.delete_object(Bucket=bucket.name, Key=key, VersionId=marker["VersionId"])
    assert bucket.keys() == [key]
    with pytest.raises(CommandError, match="history was rewritten"):
        call_command("audit_verify")
