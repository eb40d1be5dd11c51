"""Reads that several services, entry points and the audit ledger share.

Selectors read; they never change state, dispatch work or check permissions (`authz` does).
Pinned definitions are immutable, so each process caches them.
"""
from functools import lru_cache
from uuid import UUID

from django.db import connection
from django.db.models import QuerySet, Subquery
from rest_framework.authtoken.models import Token

from orchestrator.models import Effect, Run, StepRun, Team, Workflow, WorkflowVersion
from orchestrator.store import Read, read_together

from .keys import idempotency_key_for
from .scheduler import Graph, graph_of
from .states import RunState, StepState


@lru_cache(maxsize=512)
def _load(version_id: int, digest: str) -> tuple[dict, Graph]:
    normalized = WorkflowVersion.objects.values_list("normalized", flat=True).get(id=version_id)
    return normalized, graph_of(normalized)


def definition_of(run: Run) -> tuple[dict, Graph]:
    """The normalized definition and DAG a run is pinned to.

    The cache key carries the digest, so a reused id (test databases) can never serve a stale
    definition. `run.version` should be loaded with `runs_with_version()`.
    """
    return _load(run.version_id, run.version.digest)


def spec_of(run: Run, step_name: str) -> dict:
    """The normalized definition of one step of `run`."""
    return definition_of(run)[1].steps[step_name]


def runs_with_version() -> QuerySet[Run]:
    """Runs joined to their version's small fields (not the definition JSON)."""
    return Run.objects.select_related("version", "version__workflow").defer(
        "version__definition", "version__normalized"
    )


def lock_run(run_id) -> Run:
    """Fetch a run (with its team: the audit entries name it) with its row locked for the rest
    of the transaction (PostgreSQL).

    Every service that changes a run or one of its steps locks the run first, and only then
    reads the step: one lock order, so two services never deadlock. SQLite has no row locks;
    there IMMEDIATE transactions serialize writers instead.
    """
    return _only(_LOCKED_RUN.rows(_db_value(Run, "id", run_id)), Run, run_id)


def lock_run_of_step(step_id: int) -> tuple[Run, StepRun]:
    """The step and its run, with the run row locked (see `lock_run`).

    The step's input (every upstream output it reads) is left unloaded: a save then leaves it
    out of the UPDATE instead of writing it back whole. Read it with `step_input_of`.
    """
    # The step is read behind the lock, in the same round trip (`lock_run_with_steps`).
    locked, found = read_together((_LOCKED_RUN_OF_STEP, (step_id,)), (_STEP, (step_id,)))
    return _only(locked, Run, f"of step {step_id}"), _only(found, StepRun, step_id)


def lock_run_with_steps(step_id: int) -> tuple[Run, StepRun, list[StepRun]]:
    """`lock_run_of_step`, with every step of the run read at once (`steps_of`), in the
    scheduler's order: for a service that ends the step and then advances the run in the same
    transaction, changing no other step in between, so the plan starts from these rows
    (`run_advance(steps=...)`) instead of reading them again. Raises Run.DoesNotExist when no
    step has that id."""
    # The steps are read by a statement sent behind the lock's, in the same round trip: it
    # starts once the lock is granted, so it sees what the lock's previous holder committed.
    locked, found = read_together((_LOCKED_RUN_OF_STEP, (step_id,)), (_STEPS_OF_RUN_OF_STEP, (step_id,)))
    run = _only(locked, Run, f"of step {step_id}")
    steps = _of_run(found, run)
    step = next((s for s in steps if s.id == step_id), None)
    if step is None:
        raise StepRun.DoesNotExist(f"step {step_id}")
    return run, step, steps


def step_to_claim(step_id: int) -> StepRun:
    """A step with its run, the run's team, workflow and sealed secrets (no lock): what a
    worker's claim reads before it moves the step. Raises StepRun.DoesNotExist."""
    return _only(_STEP_TO_CLAIM.rows(step_id), StepRun, step_id)


def _locked_runs() -> QuerySet[Run]:
    return runs_with_version().select_related("team").select_for_update(of=("self",), no_key=True)


# The reads of every transition, defined once (`store.Read`: the fast store compiles each once
# per connection).
_LOCKED_RUN = Read(lambda run_id: _locked_runs().filter(id=run_id), UUID(int=0))
_LOCKED_RUN_OF_STEP = Read(lambda step_id: _locked_runs().filter(steps__id=step_id), 0)
_STEP = Read(lambda step_id: StepRun.objects.defer("input").filter(id=step_id), 0)
_STEP_TO_CLAIM = Read(lambda step_id: StepRun.objects.select_related(
    "run", "run__team", "run__version__workflow", "run__sealed_secrets").defer(
    "run__version__definition", "run__version__normalized").filter(id=step_id), 0)
_STEPS_OF = Read(lambda run_id: StepRun.objects.defer("input").filter(run_id=run_id), UUID(int=0))
_STEPS_OF_RUN_OF_STEP = Read(lambda step_id: StepRun.objects.defer("input").filter(
    run_id=Subquery(StepRun.objects.filter(id=step_id).values("run_id")[:1])), 0)



def token_with_user(key: str) -> Token | None:
    """The API token `key` with its user, or None (every API request reads it)."""
    found = _TOKEN.rows(key)
    return found[0] if found else None


_TOKEN = Read(lambda key: Token.objects.select_related("user").filter(key=key), "")


def _only(found: list, model: type, which) -> object:
    if not found:
        raise model.DoesNotExist(f"{model.__name__} {which}")
    return found[0]


def _db_value(model: type, field: str, value):
    return model._meta.get_field(field).get_db_prep_value(value, connection)


def steps_of(run: Run) -> list[StepRun]:
    """Every step of `run`, as `run.steps.all()` gives them: in its order, each with `step.run`
    the instance given, and its input left unloaded.

    The scheduler reads them at every transition of a run, so the read is compiled once
    (`compiled`).
    A step's input holds every upstream output it reads, so reading every step's at every
    transition grew with the square of the run's length; the plan reads outputs only, and a
    step it makes ready is given its input. Reading `step.input` of one made ready before
    costs a SELECT of its own; a save leaves an input it did not set out of the UPDATE.
    """
    return _of_run(_STEPS_OF.rows(_db_value(StepRun, "run", run.id)), run)


def _of_run(steps: list[StepRun], run: Run) -> list[StepRun]:
    """`steps`, read without their run (they were read by it), each given the instance of it
    in hand: put in the relation's cache, as `step.run = run` leaves it, without the
    descriptor's checks of a value that could differ from the key the row holds."""
    cache_run = _STEP_RUN.set_cached_value
    for step in steps:
        cache_run(step, run)
    return steps


_STEP_RUN = StepRun._meta.get_field("run")


def step_input_of(step: StepRun) -> dict:
    """A step's input ({"input", "steps"}), loaded on its own when it was deferred."""
    return StepRun.objects.values_list("input", flat=True).get(id=step.id) or {}


def latest_version(*, team: Team, name: str) -> WorkflowVersion | None:
    return (
        WorkflowVersion.objects.filter(workflow__team=team, workflow__name=name)
        .order_by("-number").first()
    )


def version_to_start(*, team: Team, name: str) -> WorkflowVersion | None:
    """The version a run of workflow `name` starts unless told otherwise: the published one."""
    workflow = (Workflow.objects.select_related("active_version")
                .filter(team=team, name=name).first())
    return workflow.active_version if workflow else None


def children_of(run: Run) -> QuerySet[Run]:
    """The child runs started by the sub-workflow steps of `run`."""
    return Run.objects.filter(parent_step__run=run)


def compensable_steps(run: Run, graph: Graph) -> list[StepRun]:
    """Completed steps with a `compensate` action whose effect happened, newest first."""
    done = Effect.objects.filter(run=run, action="default", status=Effect.Status.SUCCEEDED)
    steps = StepRun.objects.filter(run=run, state=StepState.COMPLETED, id__in=done.values("step_id"))
    return sorted((s for s in steps if graph.steps[s.name].get("compensate")),
                  key=lambda s: s.finished_at, reverse=True)


def held_runs(workflow_id: int, key: str):
    """The runs of a workflow held behind its concurrency key `key`, first in line first."""
    return Run.objects.filter(version__workflow_id=workflow_id, concurrency_key=key,
                              state=RunState.PENDING).order_by("created_at", "id")


def place_in_line(run: Run) -> int | None:
    """A held run's place among the held runs of its key (1: next to start), else None."""
    if run.state != RunState.PENDING or not run.concurrency_key:
        return None
    ahead = held_runs(run.version.workflow_id, run.concurrency_key).filter(created_at__lt=run.created_at)
    return ahead.count() + 1


def effect_key_of(run: Run, step_name: str, action: str = "default") -> str:
    """The idempotency key of the effect `action` of step `step_name` of `run` performs.

    A run's own (`keys.idempotency_key_for`), except in a fork (services/forks.py): there an
    effect a run it was forked from performed (its source, or the source's source for a step
    the source did not repeat either) keeps that run's key, so the effect ledger returns the
    recorded outcome instead of acting again — unless the fork asked for that step's effects
    to be performed again (`Run.fork_edits["repeat_effects"]`).
    """
    own = idempotency_key_for(run.id, step_name, action)
    source_id, edits = run.forked_from_id, run.fork_edits
    while source_id is not None and step_name not in edits.get("repeat_effects", ()):
        key = idempotency_key_for(source_id, step_name, action)
        if Effect.objects.filter(key=key, status=Effect.Status.SUCCEEDED).exists():
            return key
        source_id, edits = Run.objects.values_list("forked_from_id", "fork_edits").get(id=source_id)
    return own
