"""The retention sweep: deletes the rows past their team's or workflow's policy, in bounded
batches, skipping what a legal hold covers; and the ledger's prune, stopped before the first
entry of anything held.

Each batch is one transaction of at most `STEPWISE_RETENTION_BATCH` rows of a kind; a sweep
starts no batch after `STEPWISE_RETENTION_BUDGET_S` and the next sweep carries on. A run is
deleted only once it and every run above it have finished, with everything under it (steps,
attempts, map items, events, signals, effects, secrets, cached results, approvals, ...); a
sweep is recorded as one ledger entry with its counts. Never deleted: an unfinished run, a run
with a child or a fork still there (they go first), a run a running bulk re-run or evaluation
reads, a run or team under a legal hold.
"""
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import reduce
from operator import or_

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, Min, OuterRef, Q, QuerySet

from audit.models import AuditEntry
from audit.services import PruneResult, audit_prune, audit_record
from evaluation.models import EvaluationState
from notifications.models import Notification
from orchestrator.engine.clock import now
from orchestrator.engine.states import RUN_TERMINAL
from orchestrator.models import Rerun, Run
from triggers.models import EventDeadLetter, Firing

from .artifacts import artifacts_collect
from .models import Kind, LegalHold, RetentionPolicy

ACTOR = "service:retention"


@dataclass
class SweepResult:
    deleted: Counter = field(default_factory=Counter)  # model label -> rows
    batches: int = 0
    complete: bool = True  # False: the time budget ran out with rows still due
    artifacts: int = 0


@dataclass(frozen=True)
class Holds:
    """What legal holds in force cover: whole teams, and runs with every run below them."""

    team_ids: frozenset[int]
    team_slugs: frozenset[str]
    run_ids: frozenset

    @classmethod
    def in_force(cls) -> "Holds":
        holds = LegalHold.objects.filter(released_at__isnull=True)
        teams = holds.filter(run__isnull=True).values_list("team_id", "team__slug")
        runs = set(holds.filter(run__isnull=False).values_list("run_id", flat=True))
        frontier = set(runs)
        while frontier:  # a held run's child runs are under it
            frontier = set(Run.objects.filter(parent_step__run_id__in=frontier)
                           .values_list("id", flat=True)) - runs
            runs |= frontier
        return cls(frozenset(t for t, _ in teams), frozenset(s for _, s in teams), frozenset(runs))


def _due(kind: str, *, at: datetime, time_field: str, team_field: str,
         workflow_field: str | None, by_slug: bool = False) -> Q | None:
    """Rows of `kind` past the policy that applies to them: their workflow's, else their
    team's, else the deployment's default (`STEPWISE_RETENTION_DEFAULTS`); None: none is."""
    policies = RetentionPolicy.objects.filter(kind=kind).values_list(
        "team__slug" if by_slug else "team_id", "workflow_id", "days")
    teams = {team: days for team, workflow, days in policies if workflow is None}
    workflows = {workflow: days for _, workflow, days in policies if workflow is not None}
    before = lambda days: {f"{time_field}__lt": at - timedelta(days=int(days))}  # noqa: E731
    own = ~Q(**{f"{workflow_field}__in": list(workflows)}) if workflow_field and workflows else Q()
    clauses = [Q(**{workflow_field: workflow}, **before(days)) for workflow, days in workflows.items()]
    clauses += [Q(**{team_field: team}, **before(days)) & own for team, days in teams.items()]
    default = settings.STEPWISE_RETENTION_DEFAULTS.get(kind)
    if default is not None:
        clauses.append(~Q(**{f"{team_field}__in": list(teams)}) & own & Q(**before(default)))
    return reduce(or_, clauses) if clauses else None


def runs_due(*, at: datetime, holds: Holds) -> QuerySet[Run]:
    due = _due(Kind.RUNS, at=at, time_field="finished_at", team_field="team_id",
               workflow_field="version__workflow_id")
    if due is None:
        return Run.objects.none()
    return (Run.objects.filter(due, state__in=RUN_TERMINAL, finished_at__isnull=False)
            .exclude(team_id__in=holds.team_ids).exclude(id__in=holds.run_ids)
            # Under an unfinished run (a child of one still going): kept with it.
            .exclude(Q(parent_step__isnull=False) & ~Q(parent_step__run__state__in=RUN_TERMINAL))
            # Its child runs and forks point at it: they go first, in an earlier batch.
            .exclude(Exists(Run.objects.filter(parent_step__run_id=OuterRef("pk"))))
            .exclude(Exists(Run.objects.filter(forked_from_id=OuterRef("pk"))))
            # Still read by work in progress: a bulk re-run starting it again, an evaluation
            # (or its shadow) scoring it.
            .exclude(rerun_items__rerun__state=Rerun.State.RUNNING)
            .exclude(evaluation_case__evaluation__state=EvaluationState.RUNNING)
            .exclude(shadowed_by__evaluation__state=EvaluationState.RUNNING)
            .order_by("finished_at"))


def _locked_ids(queryset: QuerySet, batch: int) -> list:
    """The first `batch` ids of `queryset`, locked (PostgreSQL) so a run changing state now is
    skipped; re-filtered under the lock by the caller's conditions."""
    if connection.vendor == "postgresql":
        queryset = queryset.select_for_update(skip_locked=True, of=("self",))
    return list(queryset.values_list("pk", flat=True)[:batch])


def _delete_runs(ids: list) -> Counter:
    # Trigger rows outlive the runs they started or signalled, under their own policy.
    Firing.objects.filter(run_id__in=ids).update(run=None)
    Firing.objects.filter(signalled_run_id__in=ids).update(signalled_run=None)
    EventDeadLetter.objects.filter(run_id__in=ids).update(run=None)
    _, counts = Run.objects.filter(id__in=ids).delete()
    return Counter(counts)


def _kinds(at: datetime) -> list[tuple[callable, callable]]:
    """(rows due under the holds, delete ids) for every kind of row the sweep deletes."""
    def plain(model):
        return lambda ids: Counter(model.objects.filter(pk__in=ids).delete()[1])

    def notifications(holds: Holds):
        due = _due(Kind.NOTIFICATIONS, at=at, time_field="created_at", team_field="team",
                   workflow_field=None, by_slug=True)
        return Notification.objects.none() if due is None else (
            Notification.objects.filter(due).exclude(status=Notification.Status.PENDING)
            .exclude(team__in=holds.team_slugs).order_by("created_at"))

    def firings(holds: Holds):
        due = _due(Kind.FIRINGS, at=at, time_field="created_at", team_field="trigger__team_id",
                   workflow_field="trigger__workflow_id")
        return Firing.objects.none() if due is None else (
            Firing.objects.filter(due)
            .exclude(state__in=[Firing.State.QUEUED, Firing.State.DEBOUNCING])
            .exclude(trigger__team_id__in=holds.team_ids).exclude(run_id__in=holds.run_ids)
            .exclude(signalled_run_id__in=holds.run_ids)
            .exclude(Exists(Firing.objects.filter(coalesced_into_id=OuterRef("pk"))))
            .order_by("created_at"))

    def dead_letters(holds: Holds):
        due = _due(Kind.DEAD_LETTERS, at=at, time_field="created_at",
                   team_field="trigger__team_id", workflow_field="trigger__workflow_id")
        return EventDeadLetter.objects.none() if due is None else (
            EventDeadLetter.objects.filter(due).exclude(trigger__team_id__in=holds.team_ids)
            .exclude(run_id__in=holds.run_ids).order_by("created_at"))

    return [(lambda holds: runs_due(at=at, holds=holds), _delete_runs),
            (notifications, plain(Notification)), (firings, plain(Firing)),
            (dead_letters, plain(EventDeadLetter))]


def retention_sweep(*, batch: int | None = None, budget_s: float | None = None,
                    collect_artifacts: bool = True) -> SweepResult:
    """Delete every row past its policy, batch by batch, then the unreferenced artifacts
    (`retention.artifacts`), and record the sweep in the ledger. Safe beside running work and
    beside another sweep: a batch re-reads what is due under its locks."""
    batch = batch or settings.STEPWISE_RETENTION_BATCH
    budget_s = settings.STEPWISE_RETENTION_BUDGET_S if budget_s is None else budget_s
    deadline = time.monotonic() + budget_s
    result, at = SweepResult(), now()
    for rows_due, delete in _kinds(at):
        while True:
            if time.monotonic() >= deadline:
                result.complete = False
                break
            with transaction.atomic():
                # Holds are read in each batch's transaction: one placed meanwhile counts.
                ids = _locked_ids(rows_due(Holds.in_force()), batch)
                if ids:
                    result.deleted.update(delete(ids))
                    result.batches += 1
            if len(ids) < batch:
                break
    if collect_artifacts and time.monotonic() < deadline:
        result.artifacts = artifacts_collect(deadline=deadline)
    elif collect_artifacts:
        result.complete = False
    with transaction.atomic():
        audit_record(action="retention.swept", actor=ACTOR, subject_type="retention",
                     subject_id="sweep", outcome="complete" if result.complete else "partial",
                     payload={"deleted": dict(sorted(result.deleted.items())),
                              "batches": result.batches, "artifacts": result.artifacts})
    return result


def ledger_cutoff(*, at: datetime | None = None) -> datetime | None:
    """Before when the ledger may be pruned: the longest retention any team asks for, from the
    deployment's default for the ledger (none: kept forever), and never past the first entry of
    a held run or team, so the chain from there stays whole and verifiable."""
    at = at or now()
    default = settings.STEPWISE_RETENTION_DEFAULTS.get(Kind.LEDGER, settings.AUDIT_RETENTION_DAYS)
    if default is None:
        return None
    days = max([int(default), *RetentionPolicy.objects.filter(kind=Kind.LEDGER)
                .values_list("days", flat=True)])
    cutoff = at - timedelta(days=days)
    holds = Holds.in_force()
    first_held = AuditEntry.objects.filter(
        Q(run_id__in=holds.run_ids) | Q(team__in=holds.team_slugs)).aggregate(first=Min("created_at"))["first"]
    return min(cutoff, first_held) if first_held else cutoff


def ledger_prune_due(*, dry_run: bool = False) -> PruneResult | None:
    """Prune the ledger up to `ledger_cutoff()` through `audit_prune` (archive first, behind a
    signed checkpoint, its own entry signed after); None when the ledger is kept forever."""
    cutoff = ledger_cutoff()
    return None if cutoff is None else audit_prune(before=cutoff, actor=ACTOR, dry_run=dry_run)
