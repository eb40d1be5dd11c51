"""The ledger's retention: pruned to the deployment's default (or the longest team policy), and
never past the first entry of a run under a legal hold, so the held run's entries, and the
chain from them on, stay whole and verifiable; once the deleted runs' entries are pruned, the
artifacts only they named are collected, and the held run's stay."""
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from audit.models import AuditEntry
from orchestrator.engine import clock
from orchestrator.engine.artifacts import offload
from orchestrator.engine.services.runs import run_start
from orchestrator.models import Role, Run
from retention.artifacts import artifacts_collect
from retention.models import Kind
from retention.services import legal_hold_place, legal_hold_release, retention_policy_set
from retention.sweep import ledger_cutoff, ledger_prune_due, retention_sweep
from tests.audit.conftest import ledger, work
from tests.factories import SETUP, member

from .conftest import HOUR, age, echo, path

# The ledger is append-only and outlives test flushes: like test_ledger_prune.py, these run
# first in a session of their own.
pytestmark = [pytest.mark.django_db, pytest.mark.ledger_prefix]


def test_the_ledger_is_pruned_up_to_a_held_runs_first_entry_and_its_artifacts_stay(
        root, team, settings, monkeypatch, capsys):
    settings.STEPWISE_RETENTION_DEFAULTS = {"runs": 30, "ledger": 365}
    owner = member(team, "owner", role=Role.OWNER)
    monkeypatch.setattr(clock, "_source", lambda: timezone.now() - timedelta(days=400))
    version = echo(team)
    gone, held, later = (work(run_start(version=version, input={"a": c * 3000}, actor=SETUP))
                         for c in "ghk")
    monkeypatch.undo()
    refs = {c: offload(c * 3000)["$artifact"] for c in "ghk"}
    hold = legal_hold_place(run=held, reason="a customer's claim", actor=owner)
    age(root, 2 * HOUR)

    # The rows: the held run stays, the others go; the ledger still names their values.
    retention_sweep()
    assert list(Run.objects.values_list("pk", flat=True)) == [held.pk]
    assert artifacts_collect() == 0

    # The ledger: the prefix before the held run's first entry goes, nothing after it.
    first_held = ledger(run_id=held.pk)[0]
    assert ledger_cutoff() == first_held.created_at
    pruned = ledger_prune_due()
    assert pruned.through_sequence == first_held.sequence - 1
    assert not AuditEntry.objects.filter(run_id=gone.pk).exists()
    assert AuditEntry.objects.filter(run_id=held.pk).count() == len(ledger(run_id=held.pk)) > 0
    assert AuditEntry.objects.filter(run_id=later.pk).exists()  # after the held run's start
    call_command("audit_verify")
    assert "audit ledger: OK" in capsys.readouterr().out

    # Now only the held run's rows and the ledger after it name values: the rest is collected.
    assert artifacts_collect() == 1
    assert not path(root, refs["g"]).exists()
    assert path(root, refs["h"]).exists() and path(root, refs["k"]).exists()

    # Released, the next prune goes on to the cutoff, and the chain still verifies.
    legal_hold_release(hold=hold, reason="claim settled", actor=owner)
    assert ledger_prune_due().deleted > 0
    assert not AuditEntry.objects.filter(run_id__in=[held.pk, later.pk], action__startswith="run.").exists()
    assert AuditEntry.objects.filter(action="retention.hold_released").exists()  # today's: kept
    call_command("audit_verify")
    assert "audit ledger: OK" in capsys.readouterr().out


def test_a_team_policy_longer_than_the_default_keeps_the_ledger_longer(team, settings):
    settings.STEPWISE_RETENTION_DEFAULTS = {"ledger": 365}
    owner = member(team, "owner", role=Role.OWNER)
    retention_policy_set(team=team, kind=Kind.LEDGER, days=730, actor=owner)
    cutoff = ledger_cutoff()
    assert timedelta(days=730) <= clock.now() - cutoff < timedelta(days=731)
    settings.STEPWISE_RETENTION_DEFAULTS = {}
    settings.AUDIT_RETENTION_DAYS = None
    assert ledger_cutoff() is None and ledger_prune_due() is None  # kept forever
