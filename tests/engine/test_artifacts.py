"""Large values as artifacts (`orchestrator.engine.artifacts`): stored once by their SHA-256 outside
the row, the row holding a reference, and read back as the value itself by the next step, the API
and the ledger. The storage is a directory of the test's own (the embedded default's kind);
tests/tools/test_artifacts_s3.py runs the same through django-storages on a local S3 server.
"""
import hashlib
import json

import pytest
from django.core.files.storage import FileSystemStorage
from django.db import connection

from orchestrator.engine import artifacts
from orchestrator.engine.artifacts import MARKER, ArtifactError, offload, restore
from orchestrator.engine.services.kinds.worker import step_execute
from orchestrator.models import Event, Run, StepRun
from tests.engine.test_worker import echo, start, step_of

pytestmark = pytest.mark.django_db

LIMIT = 1024


@pytest.fixture(autouse=True)
def artifact_dir(tmp_path, settings):
    """Artifacts of this test in a directory of its own, over LIMIT bytes."""
    settings.STEPWISE_ARTIFACT_BYTES = LIMIT
    settings.STORAGES = {**settings.STORAGES, "artifacts": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": tmp_path / "artifacts"}}}
    return tmp_path / "artifacts"


def files(root) -> list:
    return sorted(p for p in root.rglob("*.json")) if root.exists() else []


def raw(model, column: str, pk) -> str:
    """The column as the database holds it, not as the field reads it back."""
    key = model._meta.pk.get_db_prep_value(pk, connection)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM {model._meta.db_table} WHERE id = %s", [key])  # noqa: S608
        value = cursor.fetchone()[0]
    return value if isinstance(value, str) else json.dumps(value)


# --- what is moved, and what stays --------------------------------------------------------------


def test_a_value_under_the_threshold_stays_as_it_is(artifact_dir):
    value = {"text": "x" * (LIMIT - 20)}
    assert offload(value) is value
    assert files(artifact_dir) == []


def test_a_long_part_is_moved_and_the_rest_stays_in_the_row(artifact_dir):
    long = "a" * 5000
    shrunk = offload({"id": 7, "body": long, "tags": ["t"]})

    assert shrunk["id"] == 7 and shrunk["tags"] == ["t"]
    reference = shrunk["body"]
    text = json.dumps(long)
    assert reference == {MARKER: "sha256:" + hashlib.sha256(text.encode()).hexdigest(),
                         "bytes": len(text)}
    [file] = files(artifact_dir)
    assert file.read_text() == text
    assert restore(shrunk) == {"id": 7, "body": long, "tags": ["t"]}


def test_many_short_parts_over_the_threshold_are_stored_as_one_artifact(artifact_dir):
    items = [{"n": i} for i in range(500)]
    shrunk = offload({"items": items})

    assert set(shrunk["items"]) == {MARKER, "bytes"}
    assert len(files(artifact_dir)) == 1
    assert restore(shrunk) == {"items": items}


def test_the_same_value_is_stored_once_however_many_rows_hold_it(artifact_dir):
    long = {"report": "r" * 4000}
    first = offload({"steps": {"a": {"output": long}}})
    second = offload({"output": long})

    assert first["steps"]["a"]["output"] == second["output"]
    assert len(files(artifact_dir)) == 1


def test_a_threshold_of_zero_keeps_everything_in_the_row(settings, artifact_dir):
    settings.STEPWISE_ARTIFACT_BYTES = 0
    value = {"body": "b" * 5000}
    assert offload(value) is value
    assert files(artifact_dir) == []


def test_a_value_that_is_not_json_is_left_for_the_field_to_refuse(artifact_dir):
    value = {"x": float("nan"), "pad": "p" * 5000}
    assert offload(value) is value


# --- read back, checked ------------------------------------------------------------------------


def test_an_artifact_altered_in_the_storage_is_refused(artifact_dir):
    reference = offload("z" * 5000)
    [file] = files(artifact_dir)
    file.write_text(json.dumps("y" * 5000))
    artifacts._READ.clear()  # another process: nothing of it in memory

    with pytest.raises(ArtifactError, match="does not match its hash"):
        restore(reference)


def test_a_missing_artifact_is_an_error_not_a_silent_null(artifact_dir):
    reference = offload("z" * 5000)
    [file] = files(artifact_dir)
    file.unlink()
    artifacts._READ.clear()

    with pytest.raises(ArtifactError, match="missing"):
        restore(reference)


def test_a_row_holds_a_reference_and_reads_back_as_the_value(team, artifact_dir):
    run = start(team, echo("a"))
    step = step_of(run, "a")
    big = {"rows": [{"id": i, "name": f"customer {i}"} for i in range(300)]}

    step.output = big
    step.save(update_fields=["output"])

    stored = raw(StepRun, "output", step.id)
    assert MARKER in stored and len(stored) < 200
    artifacts._READ.clear()
    assert StepRun.objects.get(id=step.id).output == big
    assert StepRun.objects.filter(id=step.id).values_list("output", flat=True).get() == big
    # A bulk update offloads too.
    StepRun.objects.filter(id=step.id).update(output={"again": big})
    assert len(raw(StepRun, "output", step.id)) < 200
    assert StepRun.objects.get(id=step.id).output == {"again": big}


# --- through the engine --------------------------------------------------------------------------

DOCUMENT = "Quarterly report. " * 2000  # ~36 KB: an uploaded document a workflow reads


def test_a_large_output_reaches_the_next_step_and_is_stored_once(team, artifact_dir):
    run = start(team,
                echo("read", params={"text": "{{ input.document }}"}),
                echo("measure", after=["read"], params={"length": "{{ steps.read.output.text | length }}",
                                                        "start": "{{ steps.read.output.text[:9] }}"}),
                input={"document": DOCUMENT})

    step_execute(step_id=step_of(run, "read").id, worker="w")
    measure = step_of(run, "measure")
    if measure.state == "queued":  # not carried (another queue, or carrying is off)
        step_execute(step_id=measure.id, worker="w")

    run.refresh_from_db()
    assert run.state == "completed"
    assert step_of(run, "measure").output == {"length": str(len(DOCUMENT)), "start": "Quarterly"}
    assert step_of(run, "read").output == {"text": DOCUMENT}
    # The run's input, the first step's output and the second step's input all hold the
    # document: one artifact, three references of under 200 bytes each.
    assert len(files(artifact_dir)) == 1
    assert len(raw(Run, "input", run.id)) < 200
    assert len(raw(StepRun, "output", step_of(run, "read").id)) < 200
    measure_input = raw(StepRun, "input", step_of(run, "measure").id)
    assert len(measure_input) < 400 and MARKER in measure_input


def test_the_ledger_records_the_reference_its_digest_covers(team, artifact_dir):
    """The audit entry of the step's completion names the step's output by its SHA-256, the
    artifact the step's row names too, rather than copying it (tests/audit/test_large_values.py)."""
    from audit.models import AuditEntry

    run = start(team, echo("read", params={"text": "{{ input.document }}"}), input={"document": DOCUMENT})
    step_execute(step_id=step_of(run, "read").id, worker="w")

    entry = AuditEntry.objects.get(run_id=run.id, action="step.completed")
    assert set(entry.data["output"]["text"]) == {MARKER, "bytes"}
    assert restore(entry.data["output"]) == {"text": DOCUMENT}
    completed = Event.objects.get(run=run, kind="run.completed")
    assert completed.payload == {"read": {"text": DOCUMENT}}
    assert Run.objects.get(id=run.id).output == {"read": {"text": DOCUMENT}}


class Unwritable(FileSystemStorage):
    """An artifact storage that cannot be written (a bucket out of reach)."""

    def _save(self, name, content):
        raise OSError("the artifact storage is unreachable")


def test_an_unwritable_storage_leaves_the_step_to_its_lease_and_the_reaper(team, settings, move_clock):
    from orchestrator.engine.services.kinds.worker import (
        Usage,
        step_claim,
        step_lease_expired,
        step_succeed,
    )
    from tests.engine.test_worker import RETRY

    settings.STORAGES = {**settings.STORAGES, "artifacts": {
        "BACKEND": f"{__name__}.Unwritable", "OPTIONS": {"location": "/nonexistent"}}}
    run = start(team, echo("read", params={"text": "{{ input.document }}"}, retry=RETRY, timeout_s=600),
                input={"document": "short"})
    step = step_of(run, "read")
    claim = step_claim(step_id=step.id, worker="w")
    with pytest.raises(OSError, match="unreachable"):
        step_succeed(step_id=step.id, attempt=claim.attempt, output={"text": DOCUMENT}, usage=Usage(),
                     worker="w")

    step = step_of(run, "read")
    assert (step.state, step.output) == ("running", None)  # nothing of the output was kept
    assert not Event.objects.filter(run=run, kind="step.completed").exists()
    move_clock(settings.STEPWISE_LEASE_S + 1)
    assert step_lease_expired(step_id=step.id)
    assert step_of(run, "read").state == "retrying"


def test_data_that_looks_like_a_reference_reads_back_as_that_data(team, settings, artifact_dir):
    """A caller cannot name an artifact (another team's value, by its hash) in its own input and
    have it read back: what looks like a reference is stored as the data it is."""
    secret = offload({"contract": "c" * 5000})["contract"]  # someone else's value, by reference
    forged = {"ticket": "T-1", "attachment": dict(secret)}

    for limit in (LIMIT, 0):  # artifacts on, and off
        settings.STEPWISE_ARTIFACT_BYTES = limit
        run = start(team, echo("read"), input=forged)
        assert Run.objects.get(id=run.id).input == forged
        assert Run.objects.get(id=run.id).input["attachment"] != "c" * 5000
