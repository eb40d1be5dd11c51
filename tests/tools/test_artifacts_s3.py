"""Artifacts in an S3-compatible bucket through django-storages (the production setting,
`STEPWISE_ARTIFACTS_S3_BUCKET`), against a real local S3 server (moto in server mode)."""
import json
import uuid
from dataclasses import dataclass

import boto3
import pytest

from orchestrator.engine import artifacts
from orchestrator.engine.artifacts import ArtifactError
from orchestrator.engine.services.kinds.worker import step_execute
from orchestrator.models import Run
from tests.engine.test_worker import echo, start, step_of

pytestmark = pytest.mark.django_db

DOCUMENT = "Contract clause. " * 3000


@dataclass
class Bucket:
    client: object  # boto3's S3 client
    name: str


@pytest.fixture
def s3(s3_server, settings, monkeypatch) -> Bucket:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    bucket = Bucket(boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1"),
                    f"artifacts-{uuid.uuid4().hex[:12]}")  # a bucket of this test's own
    bucket.client.create_bucket(Bucket=bucket.name)
    settings.STEPWISE_ARTIFACT_BYTES = 1024
    # The same options settings.py builds from the STEPWISE_ARTIFACTS_S3_* variables.
    settings.STORAGES = {**settings.STORAGES, "artifacts": {
        "BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": {
            "bucket_name": bucket.name, "location": "stepwise-artifacts",
            "endpoint_url": s3_server, "region_name": "us-east-1", "default_acl": None,
            "querystring_auth": False, "file_overwrite": True}}}
    return bucket


def objects(bucket: Bucket) -> dict[str, bytes]:
    listed = bucket.client.list_objects_v2(Bucket=bucket.name).get("Contents", [])
    return {o["Key"]: bucket.client.get_object(Bucket=bucket.name, Key=o["Key"])["Body"].read()
            for o in listed}


def test_a_large_output_is_an_object_in_the_bucket_and_the_next_step_reads_it(team, s3):
    run = start(team, echo("read", params={"text": "{{ input.document }}"}),
                echo("count", after=["read"], params={"words": "{{ steps.read.output.text | wordcount }}"}),
                input={"document": DOCUMENT})
    step_execute(step_id=step_of(run, "read").id, worker="w")
    if step_of(run, "count").state == "queued":
        step_execute(step_id=step_of(run, "count").id, worker="w")

    assert Run.objects.get(id=run.id).state == "completed"
    [(key, body)] = objects(s3).items()
    assert key.startswith("stepwise-artifacts/sha256/") and json.loads(body) == DOCUMENT
    artifacts._READ.clear()  # as another process would: read from the bucket
    assert step_of(run, "read").output == {"text": DOCUMENT}
    assert step_of(run, "count").output == {"words": str(len(DOCUMENT.split()))}


def test_an_object_removed_from_the_bucket_is_an_error(team, s3):
    reference = artifacts.offload("q" * 5000)
    [key] = objects(s3)
    s3.client.delete_object(Bucket=s3.name, Key=key)
    artifacts._READ.clear()

    with pytest.raises(ArtifactError, match="missing"):
        artifacts.restore(reference)
