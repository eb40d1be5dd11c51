"""Artifact garbage collection: an artifact no row references (a run's input, a value inside
another artifact, a ledger payload) and older than the grace period is deleted; a referenced
one, or a recent one, is kept; a run deleted by retention leaves its artifacts while the ledger
names them. A process whose memory of an artifact has expired refreshes it before referencing it,
so the collector never deletes what a row is about to point at."""
import time
from datetime import timedelta

import pytest
from django.db import transaction

from audit.models import AuditEntry
from audit.services import audit_record
from orchestrator.engine import clock
from orchestrator.engine.artifacts import is_reference, offload, store
from orchestrator.engine.hashing import canonical_json
from orchestrator.engine.services.runs import run_start
from orchestrator.models import Role, Run
from retention.artifacts import artifacts_collect, stored
from retention.models import Kind
from retention.services import legal_hold_place, retention_policy_set
from retention.sweep import retention_sweep
from tests.audit.conftest import work
from tests.factories import SETUP, member

from .conftest import HOUR, age, echo, path

pytestmark = pytest.mark.django_db

def test_an_unreferenced_artifact_is_collected_and_referenced_ones_are_kept(root, team):
    orphan = store(canonical_json({"orphan": "o" * 3000}))["$artifact"]
    # The run's input: twelve long parts, each its own artifact, inside one the row names.
    value = {f"k{i}": chr(ord("a") + i) * 3000 for i in range(12)}
    run_start(version=echo(team), input=value, actor=SETUP)
    with transaction.atomic():
        audit_record(action="test.large", actor="service:test", subject_type="ledger",
                     subject_id=1, payload={"blob": "z" * 3000})
    everything = set(stored())
    assert orphan in everything and len(everything) >= 15
    age(root, 2 * HOUR)
    recent = store(canonical_json({"recent": "r" * 3000}))["$artifact"]

    assert artifacts_collect() == 1
    assert not path(root, orphan).exists()
    assert set(stored()) == everything - {orphan} | {recent}  # the recent one is in its grace


def test_a_deleted_runs_artifacts_stay_while_the_ledger_names_them(root, team, monkeypatch):
    owner = member(team, "owner", role=Role.OWNER)
    version = echo(team)
    gone = work(run_start(version=version, input={"a": "g" * 3000}, actor=SETUP))
    held = work(run_start(version=version, input={"a": "h" * 3000}, actor=SETUP))
    assert gone.state == held.state == "completed", gone.error
    gone_ref, held_ref = (offload(c * 3000) for c in "gh")
    assert is_reference(gone_ref) and is_reference(held_ref)
    gone_ref, held_ref = gone_ref["$artifact"], held_ref["$artifact"]
    retention_policy_set(team=team, kind=Kind.RUNS, days=1, actor=owner)
    legal_hold_place(run=held, reason="litigation", actor=owner)
    age(root, 2 * HOUR)

    later = clock.now() + timedelta(days=2)
    monkeypatch.setattr(clock, "_source", lambda: later)
    result = retention_sweep()

    assert not Run.objects.filter(pk=gone.pk).exists() and Run.objects.filter(pk=held.pk).exists()
    # The ledger's entries of the deleted run still name its value: kept with the ledger
    # (test_ledger_hold.py prunes it, and the artifact goes).
    assert result.artifacts == 0 and path(root, gone_ref).exists()
    assert AuditEntry.objects.filter(run_id=gone.pk, payload__contains=gone_ref).exists()
    assert path(root, held_ref).exists()
    assert Run.objects.get(pk=held.pk).input == {"a": "h" * 3000}


def test_a_process_refreshes_an_artifact_it_relies_on_once_its_memory_of_it_expired(root, settings):
    settings.STEPWISE_ARTIFACT_MEMORY_S = 0.2
    text = canonical_json({"shared": "s" * 3000})
    digest = store(text)["$artifact"]
    age(root, 2 * HOUR)  # written long ago, referenced by no row since
    time.sleep(0.3)  # what this process remembers of it has expired

    # A row is about to reference it (the field stores its value before the row is written),
    # and the collector runs before that row is committed.
    assert store(text)["$artifact"] == digest
    assert artifacts_collect() == 0
    assert path(root, digest).exists()
    assert time.time() - path(root, digest).stat().st_mtime < HOUR


def test_an_artifact_deleted_meanwhile_is_written_again_by_the_next_process_that_needs_it(root, settings):
    settings.STEPWISE_ARTIFACT_MEMORY_S = 0.2
    text = canonical_json({"again": "a" * 3000})
    digest = store(text)["$artifact"]
    age(root, 2 * HOUR)
    assert artifacts_collect() == 1 and not path(root, digest).exists()
    time.sleep(0.3)
    store(text)
    assert path(root, digest).read_text() == text

