"""Evaluations: one version of a workflow run over one version of a dataset, one service each to
start, advance, and cancel one.

Every case becomes a run on the `evaluation` capacity class, sandboxed (`Run.sandbox`): its
side-effecting steps answer from the case's `responses` and never reach the world, and its
human gates are decided as the case expects (`steps.<gate>.decision`, else approved) without
asking anyone. At most `concurrency` of an evaluation's runs are unfinished at a time, so an
evaluation of a thousand cases never floods the evaluation queues; no case starts once the runs
have cost `budget_usd` (the ones running are cancelled then, and the evaluation is `stopped`).

`evaluation_advance` is the scheduler of an evaluation, a function of what is stored: it scores
the runs that ended, starts cases while there is room and budget, and ends the evaluation when
no case is left. It runs when one of its runs ends (`orchestrator.engine.events.run_ended`) and
in a periodic sweep (`evaluation.tasks.sweep`), so a lost message delays it and loses nothing.

Who may: `evaluation.run` (editors, owners) starts and cancels an evaluation of the team's
workflows (docs/permissions.md). Starting and ending are audited.
"""
import hashlib
from decimal import Decimal

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.db.models import Sum

from audit.services import audit_record, external_call_authorize
from orchestrator.engine.authz import Action, Actor, System, label, person, require
from orchestrator.engine.clock import now
from orchestrator.engine.errors import InputInvalid, NotAllowed, ServiceError
from orchestrator.engine.selectors import definition_of
from orchestrator.engine.services.runs import run_cancel, run_start
from orchestrator.engine.states import RUN_TERMINAL, RunState, StepState
from orchestrator.integrations.connections import ConnectionRefused, connection_get, connection_kind
from orchestrator.models import Run, RunSecret, Workflow, WorkflowVersion

from .grading import case_grades
from .limits import MAX_CASES_PER_VERSION
from .models import (
    CaseRunState,
    Dataset,
    DatasetVersion,
    Evaluation,
    EvaluationCase,
    EvaluationState,
    Purpose,
)
from .scoring import passed, score_case
from .selectors import expected_from_run, outcome_of_run, risk_tier_of
from .services import answered_steps
from .summary import summarize

EVALUATOR = System("evaluation")
ADVANCE_TASK = "evaluation.tasks.advance"
EVALUATION_QUEUE = "orchestrator.evaluation"  # the orchestrator family's evaluation queue
MAX_CONCURRENCY = 50
DEFAULT_CONCURRENCY = 4
MAX_BUDGET_USD = Decimal("100000")
SHADOW_BATCH = 500  # live runs read per advance
OPEN_RUN_STATES = [state for state in RunState.values if state not in RUN_TERMINAL]


def evaluation_start(*, dataset: Dataset, version: int, actor: Actor, budget_usd, dataset_version: int | None = None,
                     concurrency: int = DEFAULT_CONCURRENCY, note: str = "",
                     sandbox_connections: dict | None = None) -> Evaluation:
    """Evaluate version `version` of the dataset's workflow over the dataset's version
    `dataset_version` (default: its latest): an evaluation with one pending case per case of
    that version, its first cases started once this commits. `sandbox_connections` names, for
    a connection the workflow writes through, the connection of the same kind (granted to the
    team) its side-effecting calls go to instead of being answered. Audited.

    Raises Forbidden without evaluation.run in the workflow's team; InputInvalid (every problem
    with its path) for a version or dataset version that does not exist, a dataset version
    without cases, a budget that is not a positive amount or a concurrency out of 1..50."""
    require(actor, Action.EVALUATION_RUN, team=dataset.team)
    problems = []
    workflow_version = WorkflowVersion.objects.filter(workflow_id=dataset.workflow_id, number=version).first() \
        if isinstance(version, int) else None
    if workflow_version is None:
        problems.append({"path": "version", "message": f"workflow '{dataset.workflow.name}' has no version {version}"})
    cases_of = _dataset_version(dataset, dataset_version, problems)
    budget = _limits(budget_usd, concurrency, note, problems)
    problems += _connections_problems(sandbox_connections, team=dataset.team.slug)
    if problems:
        raise InputInvalid("the evaluation is invalid", problems)
    with transaction.atomic():
        evaluation = Evaluation(team=dataset.team, workflow=dataset.workflow, version=workflow_version,
                                dataset_version=cases_of, budget_usd=budget, concurrency=concurrency,
                                note=note, created_by=person(actor), sandbox_connections=sandbox_connections or {})
        evaluation.save()
        EvaluationCase.objects.bulk_create(
            [EvaluationCase(evaluation=evaluation, case=case, key=case.key, risk_tier=case.risk_tier)
             for case in cases_of.cases.order_by("key")], batch_size=500)
        _audit(evaluation, actor, "evaluation.started", "started", {"case_count": cases_of.case_count})
        transaction.on_commit(lambda: advance_later(evaluation.id))
    return evaluation


def evaluation_advance(*, evaluation_id: int) -> Evaluation:
    """Score the evaluation's runs that ended, then start cases while fewer than `concurrency`
    runs are unfinished and the runs have cost less than the budget; end it when every case is
    scored (completed) or the budget is spent (stopped: the runs still going are cancelled and
    the cases not started are `not_run`). Idempotent: with nothing new it changes nothing."""
    _score_ended(evaluation_id)
    with transaction.atomic():
        # The evaluation's row alone: locking its team's too would hold the row every run's
        # writes check their key against, while this waits for the ledger's lock (a deadlock).
        evaluation = Evaluation.objects.select_for_update(of=("self",)).select_related("version", "team").get(pk=evaluation_id)
        spent = _spent(evaluation)
        if evaluation.is_finished:
            # A run cancelled at the stop may settle a model call after it: its cost still counts.
            if spent != evaluation.cost_usd:
                evaluation.cost_usd = spent
                evaluation.save(update_fields=["cost_usd"])
            return evaluation
        evaluation.cost_usd = spent
        evaluation.save(update_fields=["cost_usd"])
        unfinished = evaluation.cases.filter(state=CaseRunState.RUNNING).count()
        if spent >= evaluation.budget_usd:
            _stop(evaluation, reason=f"the budget of {_usd(evaluation.budget_usd)} USD was spent "
                  f"({_usd(spent)} USD)", cancel_runs=True)
            return evaluation
        if evaluation.purpose == Purpose.SHADOW:
            _follow_live_runs(evaluation)
        room = evaluation.concurrency - unfinished
        pending = list(evaluation.cases.filter(state=CaseRunState.PENDING)
                       .select_related("case", "live_run")[:max(room, 0)])
        for row in pending:
            _start_case(evaluation, row)
        if not pending and unfinished == 0 and _all_taken(evaluation) and not evaluation.cases.filter(
                state__in=(CaseRunState.PENDING, CaseRunState.RUNNING)).exists():
            evaluation.complete(summary=_summary(evaluation))
            evaluation.save()
            _audit(evaluation, EVALUATOR, "evaluation.completed", "completed", _headline(evaluation))
    return evaluation


def evaluation_cancel(*, evaluation_id: int, actor: Actor, reason: str = "") -> Evaluation:
    """Stop an evaluation that is running: its unfinished runs are cancelled, the cases not
    started are `not_run`, and what was scored is summarised. Audited. Raises Forbidden without
    evaluation.run, NotAllowed when it has ended."""
    with transaction.atomic():
        evaluation = Evaluation.objects.select_for_update(of=("self",)).select_related("team", "version").get(pk=evaluation_id)
        require(actor, Action.EVALUATION_RUN, team=evaluation.team)
        if evaluation.is_finished:
            raise NotAllowed(f"the evaluation has ended ({evaluation.state})",
                             [{"path": "state", "message": evaluation.state}])
        why = reason.strip()[:500] or f"cancelled by {label(actor)}"
        _end_runs(evaluation, actor=actor, reason=why)
        evaluation.cancel(reason=why, summary=_summary(evaluation))
        evaluation.save()
        _audit(evaluation, actor, "evaluation.cancelled", "cancelled", {"reason": why, **_headline(evaluation)})
    return evaluation


def shadow_start(*, workflow: Workflow, version: int, actor: Actor, budget_usd, sample_percent: int = 10,
                 max_cases: int = 100, concurrency: int = DEFAULT_CONCURRENCY, note: str = "",
                 sandbox_connections: dict | None = None) -> Evaluation:
    """Run version `version` (a draft) in shadow: from now on, `sample_percent` of the live runs
    of the published version that end (chosen by their id) are run again on the draft with
    the same input, sandboxed, each scored against what the live run did, until `max_cases`
    were or the budget is spent. Audited.

    Raises Forbidden without evaluation.run; InputInvalid for the published version itself, no
    published version, another shadow of the workflow still running, or a sample, a maximum,
    a budget or a concurrency out of range."""
    require(actor, Action.EVALUATION_RUN, team=workflow.team)
    problems = []
    draft = workflow.versions.filter(number=version).first() if isinstance(version, int) else None
    if draft is None:
        problems.append({"path": "version", "message": f"workflow '{workflow.name}' has no version {version}"})
    elif draft.id == workflow.active_version_id:
        problems.append({"path": "version", "message": f"version {version} is the published one: a shadow "
                         "runs another version beside it"})
    if workflow.active_version_id is None:
        problems.append({"path": "workflow", "message": f"workflow '{workflow.name}' has no published version "
                         "whose live runs a shadow could follow"})
    if Evaluation.objects.filter(workflow=workflow, purpose=Purpose.SHADOW, state=EvaluationState.RUNNING).exists():
        problems.append({"path": "workflow", "message": f"a shadow of workflow '{workflow.name}' is running: "
                         "cancel it first"})
    if not (isinstance(sample_percent, int) and 1 <= sample_percent <= 100):
        problems.append({"path": "sample_percent", "message": "a sample is 1 to 100 percent of the live runs"})
    if not (isinstance(max_cases, int) and 1 <= max_cases <= MAX_CASES_PER_VERSION):
        problems.append({"path": "max_cases", "message": f"1 to {MAX_CASES_PER_VERSION:,} live runs"})
    budget = _limits(budget_usd, concurrency, note, problems)
    problems += _connections_problems(sandbox_connections, team=workflow.team.slug)
    if problems:
        raise InputInvalid("the shadow is invalid", problems)
    with transaction.atomic():
        evaluation = Evaluation(team=workflow.team, workflow=workflow, version=draft, purpose=Purpose.SHADOW,
                                baseline=workflow.active_version, sample_percent=sample_percent,
                                max_cases=max_cases, examined_until=now(), budget_usd=budget,
                                concurrency=concurrency, note=note, created_by=person(actor),
                                sandbox_connections=sandbox_connections or {})
        evaluation.save()
        _audit(evaluation, actor, "evaluation.started", "started",
               {"shadow_of": workflow.active_version.number, "sample_percent": sample_percent,
                "max_cases": max_cases})
    return evaluation


def evaluations_sweep() -> int:
    """Advance every running evaluation (the backstop for a lost run_ended message); how many."""
    ids = list(Evaluation.objects.filter(state=EvaluationState.RUNNING).values_list("id", flat=True))
    for evaluation_id in ids:
        evaluation_advance(evaluation_id=evaluation_id)
    return len(ids)


# --- one case ------------------------------------------------------------------------------------


def sandbox_of(case, definition: dict, *, connections: dict | None = None) -> dict:
    """How a case's run is sandboxed: its declared responses, each human gate decided as the
    case expects (`expected.steps.<gate>.decision`), else approved, and the evaluation's
    sandbox connections."""
    return _sandbox("evaluation", case.expected, case.responses, definition, connections)


def _sandbox(purpose: str, expected: dict, responses: dict, definition: dict, connections: dict | None) -> dict:
    expected_steps = (expected or {}).get("steps") or {}
    decisions = {spec["name"]: (expected_steps.get(spec["name"]) or {}).get("decision", "approve")
                 for spec in definition.get("steps", []) if spec.get("type") == "human_gate"}
    return {"purpose": purpose, "responses": dict(responses or {}), "decisions": decisions,
            **({"connections": dict(connections)} if connections else {})}


def _start_case(evaluation: Evaluation, row: EvaluationCase) -> None:
    definition = evaluation.version.normalized
    connections = evaluation.sandbox_connections
    if row.case is not None:
        input, sandbox = row.case.input, sandbox_of(row.case, definition, connections=connections)
    else:  # shadow: the live run's input, its gates decided and its effects answered as they were
        input = row.live_run.input if row.live_run else {}
        sandbox = _sandbox("shadow", row.expected, responses_of_run(row.live_run) if row.live_run else {},
                           definition, connections)
    try:
        with transaction.atomic():
            run = run_start(version=evaluation.version, input=input, actor=EVALUATOR,
                            created_by=evaluation.created_by, trigger="evaluation", capacity="evaluation",
                            sandbox=sandbox, origin={"evaluation": evaluation.id, "case": row.key})
    except ServiceError as refused:  # the run was refused (a budget, an archived workflow): say why
        row.state, row.error = CaseRunState.SCORED, str(refused)[:1000]
        row.passed, row.scores = False, {"started": False}
        row.save(update_fields=["state", "error", "passed", "scores"])
        return
    row.run, row.state = run, CaseRunState.RUNNING
    row.save(update_fields=["run", "state"])


def _score_ended(evaluation_id: int) -> None:
    """Score each case of the evaluation whose run ended: its rubrics graded by the grading
    model first, outside any transaction (a model call holds no lock), then the scores written
    under the case's lock, once."""
    ended = (EvaluationCase.objects.filter(evaluation_id=evaluation_id, state=CaseRunState.RUNNING)
             .exclude(run__state__in=OPEN_RUN_STATES).select_related("run", "case", "evaluation__version"))
    for row in ended:
        grades = _grades(row) if row.run is not None else {}
        with transaction.atomic():
            if EvaluationCase.objects.select_for_update().filter(pk=row.pk, state=CaseRunState.RUNNING).exists():
                _score(row, row.evaluation.version.normalized, grades)


def _grades(row: EvaluationCase) -> dict:
    expected = _expected(row)
    if not any("rubric" in e for e in (expected.get("steps") or {}).values()):
        return {}
    return case_grades(outcome_of_run(row.run), expected, case_input=row.run.input,
                       model=settings.STEPWISE_EVALUATION_GRADER, authorize=external_call_authorize,
                       run_id=str(row.run.id), workflow=row.evaluation.workflow.name)


def _expected(row: EvaluationCase) -> dict:
    return (row.case.expected if row.case is not None else row.expected) or {}


def _score(row: EvaluationCase, definition: dict, grades: dict | None = None) -> None:
    outcome = outcome_of_run(row.run) if row.run is not None else None
    if outcome is None:
        row.scores, row.passed = {"started": False}, False
    else:
        case = {"key": row.key, "input": row.run.input, "risk_tier": row.risk_tier,
                "tags": row.case.tags if row.case is not None else []}
        row.scores = score_case(outcome, _expected(row), definition, case=case,
                                grades={step: grade.score for step, grade in (grades or {}).items()})
        row.passed = passed(row.scores)
        row.grading_cost_usd = sum((grade.cost_usd for grade in (grades or {}).values()), Decimal("0"))
    row.outcome, row.state = outcome, CaseRunState.SCORED
    row.save(update_fields=["outcome", "scores", "passed", "state", "grading_cost_usd"])


def _follow_live_runs(evaluation: Evaluation) -> None:
    """Take the shadow's sample of the live runs of its baseline that ended since it last looked,
    each a pending case expecting what the live run did."""
    room = evaluation.max_cases - evaluation.cases.count()
    ended = (Run.objects.filter(version=evaluation.baseline, capacity="interactive", parent_step__isnull=True,
                                state__in=RUN_TERMINAL, finished_at__gt=evaluation.examined_until)
             .order_by("finished_at", "id")[:SHADOW_BATCH])
    ended = list(ended)
    sealed = set(RunSecret.objects.filter(run__in=[run.id for run in ended]).values_list("run_id", flat=True))
    rows = []
    for run in ended:
        if len(rows) >= room:
            break
        evaluation.examined_until = run.finished_at
        if sampled(run.id, evaluation.sample_percent) and run.id not in sealed:
            rows.append(EvaluationCase(evaluation=evaluation, live_run=run, key=f"run-{run.id}",
                                       risk_tier=risk_tier_of(run), expected=expected_from_run(run)))
    EvaluationCase.objects.bulk_create(rows)
    evaluation.save(update_fields=["examined_until"])


def responses_of_run(run: Run) -> dict:
    """What the answered steps of a finished `run` returned, by step name: a shadow of it answers
    them the same."""
    definition, _ = definition_of(run)
    names = answered_steps(definition)
    return {name: output for name, output in run.steps.filter(name__in=names, state=StepState.COMPLETED)
            .values_list("name", "output")}


def _all_taken(evaluation: Evaluation) -> bool:
    """Whether no case is still to come: always for a dataset; for a shadow, once it has its
    `max_cases` live runs."""
    return evaluation.purpose != Purpose.SHADOW or evaluation.cases.count() >= evaluation.max_cases


def sampled(run_id, percent: int) -> bool:
    """Whether a run is in a `percent` sample: by its id, so every sweep decides alike."""
    return int(hashlib.sha256(str(run_id).encode()).hexdigest()[:8], 16) % 100 < percent


def _spent(evaluation: Evaluation) -> Decimal:
    """What the evaluation's runs and its grading have cost."""
    runs = Run.objects.filter(evaluation_case__evaluation=evaluation).aggregate(total=Sum("cost_usd"))["total"]
    grading = evaluation.cases.aggregate(total=Sum("grading_cost_usd"))["total"]
    return (runs or Decimal("0")) + (grading or Decimal("0"))


def _stop(evaluation: Evaluation, *, reason: str, cancel_runs: bool) -> None:
    if cancel_runs:
        _end_runs(evaluation, actor=EVALUATOR, reason=reason)
    evaluation.stop(reason=reason, summary=_summary(evaluation))
    evaluation.save()
    _audit(evaluation, EVALUATOR, "evaluation.stopped", "stopped", {"reason": reason, **_headline(evaluation)})


def _end_runs(evaluation: Evaluation, *, actor: Actor, reason: str) -> None:
    """Cancel the evaluation's unfinished runs (each ends as cancelled and is scored so), and mark
    the cases never started."""
    for row in evaluation.cases.filter(state=CaseRunState.RUNNING).select_related("run", "case"):
        if row.run is not None and row.run.state not in RUN_TERMINAL:
            run_cancel(run_id=row.run.id, actor=EVALUATOR, reason=reason)
            row.run.refresh_from_db()
        _score(row, evaluation.version.normalized)
    evaluation.cases.filter(state=CaseRunState.PENDING).update(state=CaseRunState.NOT_RUN)


def _summary(evaluation: Evaluation) -> dict:
    rows = evaluation.cases.filter(state=CaseRunState.SCORED).values("key", "risk_tier", "scores", "passed")
    summary = summarize([{"case": r["key"], "risk_tier": r["risk_tier"], "scores": r["scores"] or {},
                          "passed": bool(r["passed"])} for r in rows])
    summary["cases"] = {state: evaluation.cases.filter(state=state).count() for state in CaseRunState.values}
    return summary


def _headline(evaluation: Evaluation) -> dict:
    cases = (evaluation.summary or {}).get("cases", {})
    return {"cost_usd": str(evaluation.cost_usd), "cases": cases}


def _dataset_version(dataset: Dataset, number: int | None, problems: list) -> DatasetVersion | None:
    found = dataset.versions.filter(number=number).first() if isinstance(number, int) else \
        dataset.latest_version if number is None else None
    if found is None:
        problems.append({"path": "dataset_version", "message": f"dataset '{dataset.name}' has no version {number}"})
    elif found.case_count == 0:
        problems.append({"path": "dataset_version", "message": f"version {found.number} of dataset "
                         f"'{dataset.name}' has no case"})
    return found


def _limits(budget_usd, concurrency, note: str, problems: list) -> Decimal | None:
    """The budget as an amount, after adding to `problems` what is wrong with it, the
    concurrency or the note."""
    budget = _budget(budget_usd, problems)
    if not (isinstance(concurrency, int) and not isinstance(concurrency, bool) and 1 <= concurrency <= MAX_CONCURRENCY):
        problems.append({"path": "concurrency", "message": f"at most 1 to {MAX_CONCURRENCY} runs at a time"})
    if not isinstance(note, str) or len(note) > 500:
        problems.append({"path": "note", "message": "a note is a text of at most 500 characters"})
    return budget


def _connections_problems(connections: object, *, team: str) -> list[dict]:
    """Every way `connections` is not a map from connections to sandbox connections of the same
    kind that `team` may use."""
    if connections is None or connections == {}:
        return []
    if not isinstance(connections, dict):
        return [{"path": "sandbox_connections", "message": "an object: connection -> the sandbox connection "
                 "its side-effecting calls go to instead"}]
    problems = []
    for name, instead in connections.items():
        where = f"sandbox_connections.{name}"
        kind = connection_kind(name)
        if kind is None:
            problems.append({"path": where, "message": f"no connection named '{name}' is configured"})
        elif not isinstance(instead, str) or instead == name:
            problems.append({"path": where, "message": "name another connection, of the same kind"})
        else:
            try:
                connection_get(instead, kind=kind, team=team)
            except ConnectionRefused as refused:
                problems.append({"path": where, "message": str(refused)})
    return problems


def _usd(amount: Decimal) -> str:
    """An amount as written, to the cent at least and no trailing zeros beyond: 0.0195, 2.00."""
    text = f"{amount.normalize():f}"
    whole, _, cents = text.partition(".")
    return f"{whole}.{cents.ljust(2, '0')}"


def _budget(value, problems: list) -> Decimal | None:
    try:
        budget = Decimal(str(value))
    except ArithmeticError:
        budget = None
    if budget is None or not budget.is_finite() or budget <= 0 or budget > MAX_BUDGET_USD:
        problems.append({"path": "budget_usd", "message": f"a budget is an amount in USD above 0 and at most "
                         f"{MAX_BUDGET_USD:,}"})
        return None
    return budget


def advance_later(evaluation_id: int) -> None:
    """Send `evaluation_advance` to a worker (by the task's name: the task module imports this one)."""
    current_app.send_task(ADVANCE_TASK, (evaluation_id,), queue=EVALUATION_QUEUE)


def _audit(evaluation: Evaluation, actor: Actor, action: str, outcome: str, payload: dict) -> None:
    audit_record(action=action, actor=label(actor), subject_type="evaluation", subject_id=evaluation.id,
                 outcome=outcome, team=evaluation.team.slug, workflow=evaluation.workflow.name,
                 workflow_version=evaluation.version.number,
                 payload={**({"dataset": evaluation.dataset_version.dataset.name,
                             "dataset_version": evaluation.dataset_version.number}
                            if evaluation.dataset_version else {"purpose": evaluation.purpose}),
                          "budget_usd": str(evaluation.budget_usd), **payload})
