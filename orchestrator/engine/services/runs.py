"""A run's life as a whole: starting it, pausing or timing it out past its duration, and
cancelling it.

A run moves forward and ends through `scheduling` (every step that ends calls it); the
services here are the ones an entry point calls for a whole run. Each checks the actor's
permission itself (`authz`).
"""
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import IntegrityError, transaction
from jsonschema import Draft202012Validator

from audit.redaction import keyed_hash
from budgets.services import budget_admit, duration_policy
from notifications.services import callback_problems, run_callback_register
from orchestrator.models import Event, Run, StepRun, WorkflowVersion
from orchestrator.store import build_row, insert_rows, update_rows

from ..authz import REAPER, Action, Actor, is_person, label, may, require
from ..capacity import capacity_problems
from ..clock import now
from ..definitions.limits import run_input_problems
from ..definitions.mandatory_gates import weakened_gates
from ..errors import (
    BudgetExceeded,
    Forbidden,
    IdempotencyConflict,
    InputInvalid,
    NotAllowed,
    ServiceError,
)
from ..events import event_record, events_record
from ..hashing import digest_of
from ..provenance import of_child as provenance_of_child
from ..provenance import of_start as provenance_of_start
from ..sandbox import sandbox_problems
from ..secret_inputs import seal_for, secret_paths, split
from ..selectors import definition_of, lock_run, place_in_line
from ..states import (
    RUN_CANCELLABLE,
    RUN_LIVE,
    STOPPED_BY_RUN_END,
    RunCapacity,
    RunState,
    StepState,
)
from .admission import start_refusal_record
from .attestations import output_attest
from .budget_gate import duration_denial, run_pause_for_budget
from .concurrency import (
    concurrency_key_of,
    concurrency_of,
    keyed_workflow_lock,
    room_for,
)
from .gate_policies import url_params, version_gate_problems
from .kinds import handler_for
from .scheduling import run_advance, run_ended_notify, run_settle_cancel, steps_stop
from .workflows import release_problems


def input_problems(schema: dict, value: object) -> list[dict]:
    """Every way `value` violates `schema`, as [{"path", "message"}] (path like input.a[0]).

    Formats are checked (`format: email`, `date-time`, `uri`, `uuid`, ...), not only noted. A
    message about a secret value (secret_inputs) does not quote it: refusals are recorded."""
    problems = []
    secret = secret_paths(schema, value) if isinstance(value, dict) else []
    validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    for error in sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path)):
        path = "input"
        for part in error.absolute_path:
            path += f"[{part}]" if isinstance(part, int) else f".{part}"
        at = tuple(str(part) for part in error.absolute_path)
        hidden = any(at[:len(p)] == p for p in secret)
        problems.append({"path": path, "message": f"the secret value fails '{error.validator}' "
                         "of its schema" if hidden else error.message})
    return problems


@dataclass(frozen=True)
class ForkOrigin:
    """What `run_start` needs to start a fork (`services.forks` decides it): the run it comes
    from, the step it runs again from, the steps carried over completed and what the fork
    changed."""

    source: Run
    step: str
    carried: dict[str, tuple[object, object]]  # step name -> its (input, output) in the source
    edits: dict  # Run.fork_edits
    events: list[tuple[str, dict]] = field(default_factory=list)  # (kind, payload) on the fork


def run_start(*, version: WorkflowVersion, input: dict, actor: Actor, created_by=None,
              idempotency_key: str | None = None, parent_step: StepRun | None = None,
              trigger: str = "api", origin: dict | None = None,
              known_secrets: Collection[str] = (), callback_url: str = "",
              callback_secret: str = "", provenance: dict | None = None,
              capacity: str | None = None, sandbox: dict | None = None,
              fork: ForkOrigin | None = None) -> Run:
    """Create a run pinned to `version`, start it, and schedule its first steps.

    `actor` starts it (a person needs the run.start permission in the workflow's team);
    `created_by` is the person it is started for when the actor is the engine (a sub-workflow).
    With `idempotency_key`, the same key and input return the existing run; the same key with
    another input raises IdempotencyConflict. Raises InputInvalid (and creates nothing) when
    the input does not satisfy the workflow's input_schema, Forbidden without the permission,
    BudgetExceeded when a team's or workflow's budget refuses a new run — its cap on unfinished
    runs or its spent period (not a child run: it is part of its parent's) —, audited once
    per window (`admission`).
    Check `run._created` to tell a new run from a replay.

    `trigger` is the kind of entry point ("api", "sub_workflow", "schedule", "webhook", ...);
    `origin`, when a trigger started the run, says which one and why ({"trigger", "name",
    "kind", "key", ...}): it is recorded on the run.created event, so the audit timeline shows it.

    Secret values of the input (`secret_inputs`: `writeOnly` in the input schema, a key that
    names a secret, or one of `known_secrets`, a parent's) are stored sealed, and the run's
    input holds a marker in their place.

    `callback_url` (with `callback_secret`, its signing key) is POSTed when the run waits or
    ends (docs/live.md#callbacks); a URL the team's egress policy refuses is InputInvalid.

    `provenance` says who set the run in motion (`orchestrator.engine.provenance`): a trigger passes
    its own; by default it is the person `actor` on the path `trigger`, and a child run's is
    its parent's. It is stored on the run and on its run.created event (so in the ledger).

    `capacity` (a class of `engine.capacity`; None: the workflow's `capacity`, else interactive)
    is where the run's work is sent and whose share of each provider quota it draws on; an
    evaluation run is left out of the team's and workflow's admission caps and spend (it
    keeps its own `budget.max_cost_usd`). `sandbox` (`orchestrator.engine.sandbox`; None: a live
    run) answers its side-effecting calls, gates and inputs in place of the world; a sandboxed
    run takes no callback. A bad one of either is InputInvalid, each problem by path. A child
    run has its parent's capacity and sandbox, whatever is passed.

    `fork` (`services.forks.run_fork` builds it) starts the run as a fork of another: linked to
    it, its carried steps created completed with the source's input and output (nothing run,
    nothing spent), each with a `step.carried` event; the source gets a `run.fork_started` event.
    """
    team = version.workflow.team
    require(actor, Action.RUN_START, team=team)
    problems = run_input_problems(input) or input_problems(version.normalized["input_schema"], input)
    if callback_url or callback_secret:
        problems += callback_problems(url=callback_url, secret=callback_secret, team=team.slug)
    if parent_step is not None:  # part of its parent's work, answered by the same sandbox
        capacity, sandbox = parent_step.run.capacity, parent_step.run.sandbox
    elif capacity is None:
        capacity = version.normalized.get("capacity") or RunCapacity.INTERACTIVE
    problems += _class_problems(capacity, sandbox, callback=bool(callback_url))
    if problems:
        raise InputInvalid("run input is invalid", problems)
    stored_input, secrets = split(version.normalized["input_schema"], input, known=known_secrets)
    # The digest proves a replay is the same request without being a hash of a secret.
    request = {"workflow": version.workflow.name, "version": version.number, "input": stored_input}
    if capacity != RunCapacity.INTERACTIVE or sandbox is not None:  # a live run's digest as it was
        request |= {"capacity": capacity, "sandbox": sandbox}
    if fork is not None:
        request |= {"fork": {"from": str(fork.source.id), "step": fork.step, **fork.edits}}
    request_digest = digest_of({**request, "secrets": keyed_hash(secrets)} if secrets else request)
    if idempotency_key:
        existing = _idempotent_replay(team.id, idempotency_key, request_digest)
        if existing:
            return existing
    if refusal := version_start_refusal(version, actor, sandboxed=sandbox is not None):
        raise refusal
    # An evaluation's runs answer to its own concurrency, never hold live runs of a key back.
    live = capacity != RunCapacity.EVALUATION and sandbox is None
    concurrency_key = concurrency_key_of(version.normalized, stored_input) if live else ""
    created_by = actor if is_person(actor) else created_by
    if parent_step is not None:
        parent = parent_step.run
        provenance = provenance_of_child(parent.provenance, parent_run_id=parent.id,
                                         created_by=created_by)
    elif provenance is None:
        provenance = provenance_of_start(actor, path=trigger)
    try:
        with transaction.atomic():
            run = _create(version, stored_input, actor, created_by, idempotency_key,
                          request_digest, parent_step, trigger, origin, secrets,
                          (callback_url, callback_secret), provenance, capacity, sandbox,
                          concurrency_key, fork)
    except BudgetExceeded as refused:
        start_refusal_record(limit=refused.detail["level"], actor=actor, team=team.slug,
                             path=provenance["path"], problems=refused.problems,
                             retry_after_s=refused.retry_after_s)
        raise
    except IntegrityError:
        existing = idempotency_key and _idempotent_replay(team.id, idempotency_key, request_digest)
        if not existing:
            raise
        return existing
    run._created = True
    return run


def _class_problems(capacity: str, sandbox: object, *, callback: bool) -> list[dict]:
    problems = capacity_problems(capacity)
    problems += sandbox_problems(sandbox)
    if sandbox is not None and callback:
        problems.append({"path": "callback_url", "message": "a sandboxed run calls nobody back"})
    return problems


def version_start_refusal(version: WorkflowVersion, actor: Actor, *, sandboxed: bool = False) -> ServiceError | None:
    """Why `actor` may not start a run of `version`, or None.

    An archived workflow starts nothing (NotAllowed). A version other than the published one
    that drops or weakens a mandatory gate of the published one, or any version that calls a
    tool a gate policy guards without a satisfying gate before it (and no owner waived that
    when publishing it), starts only for a person who may waive gates (Forbidden): no draft,
    old version, pinned trigger or policy set after publishing runs around it. Under a release
    policy (`workflow_publish`'s publish checks), a version other than the published one starts
    only when it would pass them, or for such a person: a draft its evaluation holds back does
    not run live by being named. A sandboxed run changes nothing in the world: its version's
    gates and release policy do not hold it back (an archived workflow still starts nothing).
    """
    workflow = version.workflow
    if workflow.archived_at is not None:
        return NotAllowed(f"workflow '{workflow.name}' is archived: it starts no new runs",
                          [{"path": "workflow", "message": "archived"}])
    if sandboxed:
        return None
    active = workflow.active_version
    weakened = weakened_gates(active.normalized, version.normalized, url_params) \
        if active is not None and active.id != version.id else []
    unguarded = version_gate_problems(version)
    release = release_problems(workflow, version) if active is None or active.id != version.id else []
    problems = weakened + unguarded + release
    if problems and not (is_person(actor) and may(actor, Action.WORKFLOW_WAIVE_GATE, team=workflow.team)):
        what = (f"drops or weakens a mandatory gate of the published version {active.number}"
                if weakened else "calls a tool a gate policy guards without a gate that "
                "satisfies it" if unguarded else "does not pass the workflow's release gate")
        return Forbidden(f"version {version.number} of '{workflow.name}' {what}; only an owner "
                         "may start it", [{"path": f"version.{p.path}", "message": p.message}
                                          for p in problems])
    return None


def _idempotent_replay(team_id: int, key: str, request_digest: str) -> Run | None:
    run = Run.objects.filter(team_id=team_id, idempotency_key=key).first()
    if run is None:
        return None
    if run.request_digest != request_digest:
        raise IdempotencyConflict(
            f"Idempotency-Key '{key}' was already used with a different request (run {run.id})"
        )
    run._created = False
    return run


def _create(version, input, actor, created_by, idempotency_key, request_digest, parent_step,
            trigger, origin, secrets, callback, provenance, capacity, sandbox, concurrency_key,
            fork=None) -> Run:
    # A child run is part of its parent's; an evaluation run is held to its evaluation's own
    # budget and concurrency, never to the caps of the team's live work.
    if parent_step is None and capacity != RunCapacity.EVALUATION:
        budget_admit(team=version.workflow.team, workflow=version.workflow)
    held = False
    if concurrency_key:
        keyed_workflow_lock(version.workflow_id)
        held = room_for(version.workflow_id, concurrency_key,
                        concurrency_of(version.normalized)["limit"]) == 0
    # Created and started in one INSERT: no other transaction sees the row before it commits,
    # so this one needs no lock on it, and it plans from the instances it wrote.
    run = Run(
        team=version.workflow.team, version=version, input=input, created_by=created_by,
        idempotency_key=idempotency_key or None, request_digest=request_digest,
        parent_step=parent_step, trigger=trigger, provenance=provenance, capacity=capacity,
        sandbox=sandbox, concurrency_key=concurrency_key,
    )
    if fork is not None:
        run.forked_from, run.fork_step, run.fork_edits = fork.source, fork.step, fork.edits
    if not held:
        run.start()
        max_duration = (version.normalized.get("budget") or {}).get("max_duration_s")
        if max_duration:
            run.deadline_at = run.started_at + timedelta(seconds=max_duration)
    insert_rows([run])
    seal_for(run, secrets)
    run.has_callback = bool(callback[0])
    if run.has_callback:
        run_callback_register(run=run, url=callback[0], secret=callback[1], team=run.team.slug)
    steps = [StepRun(run=run, name=s["name"], kind=s["type"], position=i)
             for i, s in enumerate(version.normalized["steps"])]
    carried = fork.carried if fork is not None else {}
    for step in steps:
        if step.name in carried:
            step.carry(step_input=carried[step.name][0], output=carried[step.name][1])
    insert_rows(steps)
    # Their events name them: a database that cannot return the ids of a bulk INSERT reads them.
    named = steps if not carried or all(step.pk for step in steps) else \
        list(StepRun.objects.filter(run=run, name__in=carried).only("id", "name", "state"))
    who = label(actor) if is_person(actor) or origin else f"service:{trigger}"
    attested: list[Event] = []
    if carried:
        _carried_attest(run, steps, named, source=fork.source, attested=attested)
    created = {"workflow": version.workflow.name, "version": version.number, "trigger": trigger}
    if origin:
        created["origin"] = origin
    created["provenance"] = provenance
    if capacity != RunCapacity.INTERACTIVE:
        created["capacity"] = capacity
    if sandbox is not None:  # what answers in place of the world, by name (not the outputs)
        created["sandbox"] = {"purpose": sandbox.get("purpose", ""),
                              "responses": sorted(sandbox.get("responses") or {}),
                              "decisions": sandbox.get("decisions") or {}}
    if concurrency_key:
        created["concurrency_key"] = concurrency_key
    # Written first, in the scheduler's INSERT of events (and its ledger entries), in this order.
    started = [build_row(Event, run=run, kind="run.created", actor=who, payload=created)]
    if held:  # it starts when a run of its key ends (concurrency.held_runs_release)
        started.append(build_row(Event, run=run, kind="run.held", actor=who, payload={
            "concurrency_key": concurrency_key, "place": place_in_line(run)}))
    else:
        started.append(build_row(Event, run=run, kind="run.running", actor=who))
    if fork is not None:
        started += [build_row(Event, run=run, kind=kind, actor=who, payload=payload)
                    for kind, payload in fork.events]
        started += [build_row(Event, run=run, step=step, kind="step.carried", actor=who,
                              payload={"from_run": str(fork.source.id)})
                    for step in named if step.name in carried]
        started += attested
        started.append(build_row(Event, run=fork.source, kind="run.fork_started", actor=who,
                                 payload={"fork": str(run.id), "step": fork.step,
                                          "version": version.number}))
    if held:
        events_record(started)
        return run
    # A database that cannot return the ids of a bulk INSERT leaves them to be read back.
    run_advance(run, actor=actor, pending=started,
                steps=steps if all(step.pk for step in steps) else None)
    return run


def _carried_attest(run: Run, steps: list[StepRun], named: list[StepRun], *, source: Run,
                    attested: list[Event]) -> None:
    """A fork's carried steps hold outputs no attempt of this run produced: the process that
    starts the fork signs their records, naming the run they were carried from."""
    ids = {step.name: step.pk for step in named}
    for step in steps:
        if step.state == StepState.COMPLETED:
            step.pk = ids[step.name]
            output_attest(run, step, producer=f"fork of run {source.id}",
                          record=lambda s, kind, payload: attested.append(build_row(
                              Event, run=run, step=s, kind=kind, actor=payload["producer"],
                              payload=payload)))
            update_rows(StepRun, count=False, where={"id": step.pk},
                        values={"attestation": step.attestation})


def run_over_duration(*, run_id) -> str:
    """A live run past its deadline (`budget.max_duration_s`, or an operator's raise of it),
    per its definition's `budget.on_duration`:

    - `pause` (the default): the run is paused with the reason (level `run.duration`) and an
      alert goes out; its running steps are stopped and held, to run again once an operator
      raises the run's duration (`operators.run_budget_raise`) and it resumes;
    - `fail`: the run is timed out and every step stopped (`run_time_out`).

    Returns what it did ("paused", "timed_out"), or "" when the run is not live or not late,
    or is paused already with nothing running.
    """
    with transaction.atomic():
        run = lock_run(run_id)
        if run.state not in RUN_LIVE or not run.deadline_at or run.deadline_at > now():
            return ""
        definition, _ = definition_of(run)
        if duration_policy(definition) == "fail":
            _time_out(run)
            return "timed_out"
        late = duration_denial(run, definition)
        if late is None:  # the deadline predates a raise of the limit: not late after all
            return ""
        paused = run_pause_for_budget(run, late, actor=REAPER)
        stopped = [handler_for(step.kind).stop(run, step, reason=late["message"], hold=True, actor=REAPER)
                   for step in run.steps.filter(state=StepState.RUNNING)]
    return "paused" if paused or any(stopped) else ""


def run_time_out(*, run_id) -> bool:
    """End a live run past its wall-clock budget (`timed_out`), its steps stopped — running
    ones too. False if it is not live or not late."""
    with transaction.atomic():
        run = lock_run(run_id)
        if run.state not in RUN_LIVE or not run.deadline_at or run.deadline_at > now():
            return False
        _time_out(run)
    return True


def _time_out(run: Run) -> None:
    for step in run.steps.filter(state=StepState.RUNNING):
        handler_for(step.kind).stop(run, step, reason=STOPPED_BY_RUN_END[RunState.TIMED_OUT],
                                    hold=False, actor=REAPER)
    steps_stop(run, reason=STOPPED_BY_RUN_END[RunState.TIMED_OUT], actor=REAPER)
    run.time_out(error={"class": "timeout", "message": "the run exceeded budget.max_duration_s"})
    run.save()
    event_record(run=run, kind="run.timed_out", actor=label(REAPER), payload=run.error)
    run_ended_notify(run)


def run_cancel(*, run_id, actor: Actor, reason: str = "run cancelled") -> Run:
    """Cancel a run cooperatively: nothing new starts, running steps finish, then `cancelled`.

    Stopping the run's steps releases what they own: open approvals are cancelled, child runs
    are cancelled the same way. Raises Forbidden without the run.cancel permission, NotAllowed
    for a run that has ended or is compensating (it ends by itself once its effects are undone).
    """
    with transaction.atomic():
        run = lock_run(run_id)
        require(actor, Action.RUN_CANCEL, team=run.team, run=run)
        if run.state == RunState.CANCELLING:
            return run  # cancelling already: asking again changes nothing
        if run.is_terminal:
            raise NotAllowed(f"run {run.id} has already ended ({run.state})")
        if run.state not in RUN_CANCELLABLE:
            raise NotAllowed(f"run {run.id} is {run.state}: it is undoing its effects and ends "
                             "by itself when that is done")
        if run.state == RunState.PENDING:
            run.cancel()
        else:
            run.request_cancel()
        run.save()
        event_record(run=run, kind=f"run.{run.state}", actor=label(actor), payload={"reason": reason})
        run_ended_notify(run)  # a pending run is cancelled at once
        running = steps_stop(run, reason=reason, actor=actor)
        run_settle_cancel(run, running=running, actor=actor)
    return run
