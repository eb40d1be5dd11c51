"""Bulk re-runs: start chosen runs of one workflow again, each with its own input, on a version
of that workflow the person picks (the fixed one) — one service to ask for it, one to start it.

`runs_rerun` records the batch (`Rerun`, one `RerunItem` per source run) and returns at once;
a worker then starts the runs in chunks (`rerun_advance`, the `orchestrator.tasks.rerun_advance`
task on the `orchestrator` queue), so two hundred runs never hold a request, and the batch's
counts show how far it got. Each new run goes through `run_start` like any other start: the
person's run.start permission, the team's and workflow's admission caps and budgets, the
version's gates and release policy, provenance (path `rerun`). Its idempotency key is derived
from the batch's key and the source run, so a repeated request, a replayed message or two
workers on one chunk never start a source twice; the batch's key is unique per team, so asking
again with it returns the same batch.

A source run that cannot be started again is refused by itself, with the reason, and the batch
goes on: one still going (re-run it once it has ended), a child run (its parent is what runs
again), an evaluation's sandboxed run, or whatever `run_start` refuses (a budget, an archived
workflow, a permission lost since). A source whose input holds sealed secrets
(`secret_inputs`) is started with them: they are unsealed in the worker's memory only, handed
to `run_start`, which seals them again for the new run; a reason recorded for it is scrubbed of
them. One whose secrets no configured key opens is refused.

Who may: run.start in the workflow's team (docs/permissions.md), checked when asked and again
by `run_start` for every source, as the person who asked. Asking is audited (`rerun.requested`),
and so is the end (`rerun.done`); each new run's `run.created` event names its batch and source.
"""
import hashlib
import uuid
from datetime import UTC, datetime, timedelta

from celery import current_app
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, transaction
from django.db.models import Count, Max, Q
from django.db.models.functions import Coalesce
from django.utils.dateparse import parse_datetime

from audit.services import audit_record
from orchestrator.models import Rerun, RerunItem, Run, Workflow, WorkflowVersion

from ..artifacts import ArtifactError
from ..authz import Action, Actor, System, label, person, require, visible, visible_workflows_named
from ..clock import now
from ..dispatch import after_commit
from ..errors import BudgetExceeded, IdempotencyConflict, InputInvalid, ServiceError
from ..hashing import digest_of
from ..secret_inputs import NONE, Revealed, revealed_for
from ..states import RUN_TERMINAL, RunCapacity, RunState
from .runs import run_start

ADVANCE_TASK = "orchestrator.tasks.rerun_advance"
#: The most source runs one batch re-runs: a filter matching more is refused, to be narrowed.
MAX_RERUN_RUNS = 1000
#: Source runs one message starts before it hands the rest to the next message.
CHUNK = 20
#: A running batch no worker has moved for this long is sent on again by the sweep.
STALL_S = 60
#: The run list's filters (`GET /api/v1/runs/`) a batch may select its source runs by.
FILTER_KEYS = ("workflow", "team", "state", "created_after", "created_before")
MAX_KEY_CHARS = 255
RERUN_ACTOR = System("rerun")


def runs_rerun(*, run_ids: list | None = None, filters: dict | None = None,
               version: WorkflowVersion, actor: Actor, key: str) -> Rerun:
    """Ask to start again, on `version`, either the runs `run_ids` or every run of the version's
    workflow matching `filters` (the run list's: state, created_after, created_before; workflow
    and team, when given, must be the version's), each with its own input. Returns the batch,
    its runs started after this commits by a worker (`rerun_advance`); `rerun._created` tells
    a new batch from a repeat.

    `key` names the batch in its team: the same key and request return the existing batch and
    start nothing; the same key with another request raises IdempotencyConflict.

    Raises Forbidden without run.start in the workflow's team; InputInvalid, every problem by
    path, for a missing or bad key, neither or both of runs and filter, a run id that is not one
    of the person's teams' runs (another team's run is not told apart from no run), a run of
    another workflow, a filter that matches nothing or more than MAX_RERUN_RUNS runs.
    """
    workflow = version.workflow
    team = workflow.team
    require(actor, Action.RUN_START, team=team)
    problems: list[dict] = []
    if not isinstance(key, str) or not key.strip() or len(key) > MAX_KEY_CHARS:
        problems.append({"path": "key", "message": f"an idempotency key of 1 to {MAX_KEY_CHARS} "
                         "characters names the batch, so asking twice starts it once"})
    selection = _selection(run_ids, filters, version, problems)
    if problems:
        raise InputInvalid("the re-run is invalid", problems)
    # The same runs in another order, or one named twice, are the same request.
    request_digest = digest_of({"version": version.id, **selection} if "filter" in selection
                               else {"version": version.id, "runs": sorted(selection["runs"])})
    existing = _replay(team.id, key, request_digest)
    if existing is not None:
        return existing
    sources = _sources(selection, version, actor)
    try:
        with transaction.atomic():
            rerun = Rerun(team=team, version=version, requested_by=person(actor), actor=label(actor),
                          key=key, request_digest=request_digest, total=len(sources),
                          selection=_summary(selection))
            rerun.save()
            RerunItem.objects.bulk_create(
                [RerunItem(rerun=rerun, position=i, source_run_id=run_id)
                 for i, run_id in enumerate(sources)], batch_size=500)
            audit_record(action="rerun.requested", actor=label(actor), subject_type="rerun",
                         subject_id=rerun.id, outcome="requested", team=team.slug,
                         workflow=workflow.name, workflow_version=version.number,
                         payload={"total": len(sources), **rerun.selection})
            _advance_on_commit(rerun.id)
    except IntegrityError:  # the same key, asked at the same moment: the batch the other made
        existing = _replay(team.id, key, request_digest)
        if existing is None:
            raise
        return existing
    rerun._created = True
    return rerun


def rerun_advance(*, rerun_id: int) -> Rerun:
    """Start the next chunk of a running batch's source runs, record each one's new run or
    refusal, update the counts, and send the rest to the next message — or, with none left,
    end the batch (`done`). A replayed message starts nothing twice: each source's start is
    idempotent, and an item records its outcome once."""
    rerun = Rerun.objects.select_related("version__workflow__team", "requested_by").get(pk=rerun_id)
    if rerun.state == Rerun.State.DONE:
        return rerun
    actor = _actor_of(rerun)
    pending = list(rerun.items.filter(outcome=RerunItem.Outcome.PENDING)
                   .select_related("source_run").defer("source_run__input", "source_run__output")[:CHUNK])
    for item in pending:
        outcome = _start_one(rerun, item.source_run, actor)
        RerunItem.objects.filter(pk=item.pk, outcome=RerunItem.Outcome.PENDING).update(
            finished_at=now(), **outcome)
    with transaction.atomic():
        rerun = Rerun.objects.select_for_update(of=("self",)).select_related(
            "version__workflow__team").get(pk=rerun_id)
        counts = rerun.items.aggregate(
            started=Count("id", filter=Q(outcome=RerunItem.Outcome.STARTED)),
            refused=Count("id", filter=Q(outcome=RerunItem.Outcome.REFUSED)))
        rerun.started, rerun.refused = counts["started"], counts["refused"]
        if rerun.state == Rerun.State.DONE:
            return rerun
        # Items, not the total: a source run deleted since (its item with it) is not awaited.
        if rerun.items.filter(outcome=RerunItem.Outcome.PENDING).exists():
            rerun.save(update_fields=["started", "refused"])
            _advance_on_commit(rerun.id)
            return rerun
        rerun.finish()
        rerun.save()
        audit_record(action="rerun.done", actor=label(RERUN_ACTOR), subject_type="rerun",
                     subject_id=rerun.id, outcome="done", team=rerun.team.slug,
                     workflow=rerun.version.workflow.name, workflow_version=rerun.version.number,
                     payload={"total": rerun.total, "started": rerun.started, "refused": rerun.refused})
    return rerun


def reruns_sweep() -> int:
    """Send on every running batch that no worker has moved for STALL_S seconds (the backstop
    for a lost message); how many."""
    stalled = (Rerun.objects.filter(state=Rerun.State.RUNNING)
               .annotate(moved=Coalesce(Max("items__finished_at"), "created_at"))
               .filter(moved__lt=now() - timedelta(seconds=STALL_S)).values_list("id", flat=True))
    ids = list(stalled)
    for rerun_id in ids:
        current_app.send_task(ADVANCE_TASK, (rerun_id,), queue="orchestrator")
    return len(ids)


def rerun_workflow(*, actor: Actor, run_ids: list | None = None, filters: dict | None = None) -> Workflow:
    """The one workflow a request's runs belong to (by `run_ids`, or named by `filters`'
    `workflow` and optional `team`), among the person's teams' — what an entry point needs to
    find the version to re-run on. Reads only. Raises InputInvalid naming the problem: no run or
    workflow of the person's teams, runs of several workflows, a name two of their teams share."""
    if run_ids is not None:
        problems: list[dict] = []
        ids = _run_ids(list(run_ids) if isinstance(run_ids, list | tuple) else run_ids, problems)
        if problems:
            raise InputInvalid("the re-run is invalid", problems)
        found = list(Workflow.objects.filter(id__in=visible(Run.objects.filter(id__in=ids), actor)
                                             .values("version__workflow_id"))
                     .select_related("team").order_by("name")[:10])
        if not found:
            raise InputInvalid("no such run", [{"path": "runs", "message": "none of these runs is "
                               "one of your teams' runs"}])
        if len(found) > 1:
            raise InputInvalid("runs of several workflows", [{"path": "runs", "message": "runs of "
                               f"{', '.join(w.name for w in found)}: re-run one workflow's runs at a time"}])
        return found[0]
    name = (filters or {}).get("workflow") if isinstance(filters, dict) else None
    if not isinstance(name, str) or not name:
        raise InputInvalid("no workflow named", [{"path": "filter.workflow", "message": "name the "
                           "workflow whose runs to re-run"}])
    found = visible_workflows_named(actor, name, team_slug=filters.get("team") or None)
    if not found:
        raise InputInvalid("no such workflow", [{"path": "filter.workflow", "message": f"no workflow "
                           f"'{name}' among your teams'"}])
    if len(found) > 1:
        raise InputInvalid("several workflows of that name", [{"path": "filter.team", "message": f"'{name}' "
                           f"exists in several of your teams ({', '.join(w.team.slug for w in found)}): "
                           "say which"}])
    return found[0]


def rerun_version(workflow: Workflow, number: object) -> WorkflowVersion:
    """Version `number` of `workflow`, read with its workflow and team; InputInvalid (path
    `version`) when it has none."""
    version = (workflow.versions.filter(number=number).first()
               if isinstance(number, int) and not isinstance(number, bool) else None)
    if version is None:
        raise InputInvalid("no such version", [{"path": "version", "message": f"workflow "
                           f"'{workflow.name}' has no version {number}"}])
    version.workflow = workflow
    return version


def run_key(rerun: Rerun, source_run_id) -> str:
    """The idempotency key of a source run's new run: from the batch's key (hashed, so any key
    fits) and the source, so the same batch never starts the same source twice."""
    return f"rerun:{hashlib.sha256(rerun.key.encode()).hexdigest()[:32]}:{source_run_id}"


# --- asking ---------------------------------------------------------------------------------------


def _selection(run_ids, filters, version: WorkflowVersion, problems: list) -> dict:
    """The request's source runs as a JSON value ({"runs": [ids]} or {"filter": {...}}), after
    adding to `problems` what is wrong with them."""
    if (run_ids is None) == (filters is None):
        problems.append({"path": "runs", "message": "give either the runs to re-run or a filter "
                         "of the run list, not both"
                         if run_ids is not None else "give the runs to re-run or a filter of the run list"})
        return {}
    if run_ids is not None:
        return {"runs": _run_ids(run_ids, problems)}
    return {"filter": _filter(filters, version, problems)}


def _run_ids(run_ids, problems: list) -> list[str]:
    if not isinstance(run_ids, list | tuple) or not run_ids:
        problems.append({"path": "runs", "message": "a list of at least one run id"})
        return []
    if len(run_ids) > MAX_RERUN_RUNS:
        problems.append({"path": "runs", "message": f"at most {MAX_RERUN_RUNS} runs in one re-run"})
        return []
    ids = []
    for i, value in enumerate(run_ids):
        try:
            ids.append(str(uuid.UUID(str(value))))
        except ValueError:
            problems.append({"path": f"runs[{i}]", "message": "not a run id"})
    return list(dict.fromkeys(ids))  # each source once, in the order given


def _filter(filters, version: WorkflowVersion, problems: list) -> dict:
    if not isinstance(filters, dict):
        problems.append({"path": "filter", "message": "an object of the run list's filters"})
        return {}
    chosen: dict = {}
    for name, value in filters.items():
        where = f"filter.{name}"
        if name not in FILTER_KEYS:
            problems.append({"path": where, "message": "not a filter of the run list (one of "
                             f"{', '.join(FILTER_KEYS)})"})
        elif name == "workflow" and value != version.workflow.name:
            problems.append({"path": where, "message": f"version {version.number} is a version of "
                             f"'{version.workflow.name}': re-run that workflow's runs"})
        elif name == "team" and value != version.workflow.team.slug:
            problems.append({"path": where, "message": f"the workflow is team "
                             f"'{version.workflow.team.slug}''s"})
        elif name == "state":
            states = [value] if isinstance(value, str) else value
            if not isinstance(states, list | tuple) or not states or \
                    any(state not in RunState.values for state in states):
                problems.append({"path": where, "message": f"one or more of {', '.join(RunState.values)}"})
            else:
                chosen["state"] = sorted(set(states))
        elif name in ("created_after", "created_before"):
            moment = _moment(value)
            if moment is not None and moment.tzinfo is not None:
                try:
                    chosen[name] = moment.astimezone(UTC).isoformat()
                    continue
                except (OverflowError, ValueError):  # no UTC time at the calendar's edge
                    pass
            problems.append({"path": where, "message": "an ISO 8601 time with its UTC offset, "
                             "within the calendar"})
    return chosen


def _moment(value) -> datetime | None:
    if isinstance(value, datetime):
        return value
    try:
        return parse_datetime(value) if isinstance(value, str) else None
    except ValueError:  # well formed, but no such day or hour
        return None


def _sources(selection: dict, version: WorkflowVersion, actor: Actor) -> list:
    """The ids of the source runs, in order, or InputInvalid naming what is wrong."""
    workflow = version.workflow
    runs = visible(Run.objects.filter(team=workflow.team), actor)
    if "runs" in selection:
        ids = selection["runs"]
        found = dict(runs.filter(id__in=ids).values_list("id", "version__workflow_id"))
        names = dict(runs.filter(id__in=ids).values_list("id", "version__workflow__name"))
        problems = []
        for i, run_id in enumerate(ids):
            key = uuid.UUID(run_id)
            if key not in found:
                problems.append({"path": f"runs[{i}]", "message": f"no run {run_id} among your teams' runs"})
            elif found[key] != workflow.id:
                problems.append({"path": f"runs[{i}]", "message": f"run {run_id} is a run of "
                                 f"'{names[key]}', not of '{workflow.name}': re-run one workflow's runs at a time"})
        if problems:
            raise InputInvalid("some runs cannot be re-run on this version", problems)
        return [uuid.UUID(run_id) for run_id in ids]
    chosen = selection["filter"]
    matching = runs.filter(version__workflow=workflow)
    if chosen.get("state"):
        matching = matching.filter(state__in=chosen["state"])
    if chosen.get("created_after"):
        matching = matching.filter(created_at__gte=parse_datetime(chosen["created_after"]))
    if chosen.get("created_before"):
        matching = matching.filter(created_at__lt=parse_datetime(chosen["created_before"]))
    ids = list(matching.order_by("created_at", "id").values_list("id", flat=True)[:MAX_RERUN_RUNS + 1])
    if not ids:
        raise InputInvalid("no run matches the filter", [{"path": "filter", "message": "no run of "
                           f"'{workflow.name}' matches: nothing to re-run"}])
    if len(ids) > MAX_RERUN_RUNS:
        raise InputInvalid("too many runs match the filter", [{"path": "filter", "message": "more "
                           f"than {MAX_RERUN_RUNS} runs match: narrow the filter (by state or time)"}])
    return ids


def _summary(selection: dict) -> dict:
    """What the batch records of its request: the filter, or how many runs were named."""
    return {"runs": len(selection["runs"])} if "runs" in selection else {"filter": selection["filter"]}


def _replay(team_id: int, key: str, request_digest: str) -> Rerun | None:
    rerun = Rerun.objects.select_related("version__workflow__team").filter(team_id=team_id, key=key).first()
    if rerun is None:
        return None
    if rerun.request_digest != request_digest:
        raise IdempotencyConflict(
            f"Idempotency-Key '{key}' was already used for another re-run (re-run {rerun.id})",
            [{"path": "Idempotency-Key", "message": "already used for another re-run"}])
    rerun._created = False
    return rerun


def _advance_on_commit(rerun_id: int) -> None:
    # Sent by name: the task module imports this one.
    after_commit(lambda: current_app.send_task(ADVANCE_TASK, (rerun_id,), queue="orchestrator"))


# --- starting ------------------------------------------------------------------------------------


def _actor_of(rerun: Rerun) -> Actor | None:
    """Who starts the batch's runs: the person who asked (checked again at every start), or the
    engine actor that asked; None when that person's account is gone."""
    if rerun.requested_by_id is not None:
        return rerun.requested_by
    if rerun.actor.startswith("user:"):
        return None
    kind, _, name = rerun.actor.partition(":")
    return System(name, kind=kind)


def _start_one(rerun: Rerun, source: Run, actor: Actor | None) -> dict:
    """Start `source` again on the batch's version; the item's outcome as fields to write."""
    if actor is None:
        return _refused(f"{rerun.actor} who asked for the re-run no longer has an account")
    if source.parent_step_id is not None:
        return _refused("a child run of a sub-workflow step: re-run its parent run instead")
    if source.capacity != RunCapacity.INTERACTIVE or source.sandbox is not None:
        return _refused("a sandboxed run of an evaluation: evaluate the version instead")
    if source.state not in RUN_TERMINAL:
        return _refused(f"still {source.state}: re-run it once it has ended (or cancel it first)")
    secrets: Revealed = NONE
    try:
        secrets = revealed_for(source.id)
        run_input = secrets.reveal(Run.objects.filter(pk=source.pk).values_list("input", flat=True).get())
    except ImproperlyConfigured:
        return _refused("its secret input is sealed under a key that is no longer configured: "
                        "it cannot be carried to a new run")
    except ArtifactError as exc:
        return _refused(f"its input cannot be read back: {exc}")
    try:
        run = run_start(version=rerun.version, input=run_input, actor=actor,
                        idempotency_key=run_key(rerun, source.id), trigger="rerun",
                        origin={"rerun": rerun.id, "source_run": str(source.id)},
                        known_secrets=secrets.known())
    except ServiceError as refused:
        return _refused(secrets.scrub(_reason(refused)), problems=secrets.scrub(refused.problems),
                        retry_after_s=getattr(refused, "retry_after_s", None))
    return {"outcome": RerunItem.Outcome.STARTED, "new_run_id": run.id, "reason": ""}


def _refused(reason: str, *, problems: list | None = None, retry_after_s: int | None = None) -> dict:
    return {"outcome": RerunItem.Outcome.REFUSED, "new_run_id": None, "reason": reason[:2000],
            "problems": problems or [{"path": "", "message": reason[:2000]}],
            "retry_after_s": retry_after_s}


def _reason(refused: ServiceError) -> str:
    """A refusal as one line: the message, each problem with a path, and when to ask again."""
    detail = "; ".join(f"{p['path']}: {p['message']}" for p in refused.problems if p.get("path"))
    text = f"{refused} ({detail})" if detail else str(refused)
    if isinstance(refused, BudgetExceeded) and refused.retry_after_s:
        text += f"; may start in {refused.retry_after_s} s"
    return text
