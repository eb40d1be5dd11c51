"""The ledger references a large value by its SHA-256 instead of copying it: an 8 MB step output
grows the database by well under 1 MB, the entry's digest covers the reference, the artifact it
names is the one the step's row names, and the ledger still verifies."""
import hashlib
import json
import os

import pytest
from django.core.management import call_command
from django.db import connection

from orchestrator.engine.artifacts import MARKER, restore
from orchestrator.engine.hashing import canonical_json
from orchestrator.engine.services.kinds.worker import step_execute
from orchestrator.models import Event, Run, StepRun
from tests.engine.test_worker import echo, start, step_of

from .conftest import ledger

pytestmark = pytest.mark.django_db
MB = 1024 * 1024


@pytest.fixture(autouse=True)
def artifact_dir(tmp_path, settings):
    """This test's artifacts in a directory of its own, at the deployment's default threshold."""
    settings.STORAGES = {**settings.STORAGES, "artifacts": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": tmp_path / "artifacts"}}}
    return tmp_path / "artifacts"


def stored_bytes(run: Run) -> int:
    """What the database holds for the run, column by column, as the database holds it."""
    key = Run._meta.pk.get_db_prep_value(run.id, connection)
    queries = [
        ("SELECT COALESCE(SUM(LENGTH(payload)), 0) FROM audit_entry WHERE run_id = %s", key),
        ("SELECT COALESCE(SUM(LENGTH(CAST(input AS TEXT)) + LENGTH(CAST(output AS TEXT))), 0) "
         "FROM orchestrator_run WHERE id = %s", key),
        ("SELECT COALESCE(SUM(LENGTH(CAST(input AS TEXT)) + COALESCE(LENGTH(CAST(output AS TEXT)), 0)), 0) "
         "FROM orchestrator_steprun WHERE run_id = %s", key),
        ("SELECT COALESCE(SUM(LENGTH(CAST(payload AS TEXT))), 0) FROM orchestrator_event WHERE run_id = %s", key),
    ]
    total = 0
    with connection.cursor() as cursor:
        for sql, param in queries:
            cursor.execute(sql, [param])
            total += int(cursor.fetchone()[0])
    return total


def raw_output(step: StepRun) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT CAST(output AS TEXT) FROM orchestrator_steprun WHERE id = %s", [step.id])
        return cursor.fetchone()[0]


def database_size() -> int | None:
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_database_size(current_database())")
        return cursor.fetchone()[0]


def test_an_8_mb_output_is_referenced_by_the_ledger_not_copied(team, artifact_dir):
    # A run's input is at most 1 MB, and so is one rendered parameter: the step makes eight
    # different megabytes of it (text no compression shrinks much).
    part = os.urandom(500 * 1024).hex()  # 1,024,000 characters
    variants = ["", " | upper", " | reverse", *[f" | replace('{c}', '-')" for c in "abcde"]]
    texts = [part, part.upper(), part[::-1], *[part.replace(c, "-") for c in "abcde"]]
    assert sum(len(t) for t in texts) > 8_000_000
    before = database_size()

    run = start(team, echo("read", params={"texts": [f"{{{{ input.part{v} }}}}" for v in variants]}),
                input={"part": part})
    step_execute(step_id=step_of(run, "read").id, worker="w")
    run.refresh_from_db()
    assert run.state == "completed" and run.output == {"read": {"texts": texts}}

    assert stored_bytes(run) < 64 * 1024
    if before is not None:
        assert database_size() - before < MB

    # The entry holds references; its digest covers them like any value.
    completed = ledger(run_id=run.id, action="step.completed")[-1]
    references = completed.data["output"]["texts"]
    for reference, text in zip(references, texts, strict=True):
        data = canonical_json(text).encode()
        assert reference == {MARKER: "sha256:" + hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    assert restore(completed.data["output"]) == {"texts": texts}
    # The step's row names the same artifacts: each value is stored once.
    output = raw_output(StepRun.objects.get(run=run, name="read"))
    for reference, text in zip(references, texts, strict=True):
        digest = reference[MARKER].removeprefix("sha256:")
        assert json.loads((artifact_dir / "sha256" / digest[:2] / f"{digest}.json").read_text()) == text
        assert reference[MARKER] in output
    assert Event.objects.get(run=run, kind="run.completed").payload == {"read": {"texts": texts}}

    call_command("audit_verify", "--allow-missing-checkpoint")


def test_a_short_value_is_still_recorded_as_it_is(team, artifact_dir):
    run = start(team, echo("read", params={"text": "{{ input.word }}"}), input={"word": "refund"})
    step_execute(step_id=step_of(run, "read").id, worker="w")
    completed = ledger(run_id=run.id, action="step.completed")[-1]
    assert completed.data["output"] == {"text": "refund"}
    assert not artifact_dir.exists() or not list(artifact_dir.rglob("*.json"))
