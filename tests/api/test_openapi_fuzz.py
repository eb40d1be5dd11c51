"""Schemathesis against the live OpenAPI schema of a real web process (docs/security.md,
"Fuzzing the API").

A team is seeded with one object in every state the API can show (approvals pending, approved,
rejected, and cancelled because the run timed out at its gate; a failed run with an open dead
letter and one redriven; a paused run with a failed step; a cancelled run; a sub-workflow
child; work done by the engine with no person behind it), then `schemathesis run` reads `/api/v1/schema/` from
uvicorn serving the ASGI app, as `make run` does, and sends what it generates from it: valid and
invalid parameters and bodies, and chains of calls that follow the links it infers. It fails on
any 5xx and on any response the schema does not describe (status code, content type, headers,
body), and on invalid input the API accepts. Settings live in `schemathesis.toml`.

Three callers: an owner of the team who is also an approver (every endpoint reachable), an
editor (saves workflows and starts runs, may not publish against a gate or manage the team), and
a plain member (mostly 403s and 404s, which must be documented too). The budget is bounded:
`STEPWISE_FUZZ_EXAMPLES` cases per operation and phase (1, as `make test` runs it; 15 in CI and
`make fuzz`) and a fixed seed. The coverage phase sends every parameter's boundary and invalid
values, about five thousand requests per caller that no budget bounds: `make test` runs it as the
owner only, who reaches every endpoint past its permission check, and CI and `make fuzz` as every
caller (`STEPWISE_FUZZ_COVERAGE`). Run it longer locally with a larger budget and
`STEPWISE_FUZZ_SEED=random`.

Runs in a session of its own (marker `fuzz`; `make test` runs that session beside the parallel
one, on a database and broker of its own): the web process dispatches work for the runs it
starts, and no worker may be consuming this session's queues meanwhile; the queues are purged
afterwards so no later session receives that work. Beside other test files, a worker another
file started would run the seeded runs' steps, and later tests would count the ledger entries
it leaves (the ledger outlives flushes).
"""
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.utils.timezone import now
from rest_framework.authtoken.models import Token

from approvals.models import ApprovalRequest
from evaluation.models import Dataset, Evaluation
from orchestrator.celery import app as celery_app
from orchestrator.engine.definitions import parse_definition_text
from orchestrator.engine.retry import StepError
from orchestrator.engine.services.kinds.human_gate import approval_grant, approval_reject
from orchestrator.engine.services.kinds.worker import Usage, step_claim, step_fail
from orchestrator.engine.services.operators import dead_letter_redrive
from orchestrator.engine.services.runs import run_cancel, run_start, run_time_out
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.management.commands.stepwise_queues import queues
from orchestrator.models import DeadLetter, Role, Run, StepRun, Workflow, WorkflowVersion
from tests.api.driving import drive_to_gate, support_run
from tests.factories import EXAMPLES, SETUP, TeamFactory, member
from tests.support.children import start_children
from tests.support.live_server import ROOT, LiveServer

pytestmark = [pytest.mark.fuzz, pytest.mark.django_db(transaction=True)]

EXAMPLES_PER_OPERATION = int(os.environ.get("STEPWISE_FUZZ_EXAMPLES", "1"))
SEED = os.environ.get("STEPWISE_FUZZ_SEED", "20260101")
# The callers whose run includes the coverage phase ("all" for every one).
COVERAGE_CALLERS = os.environ.get("STEPWISE_FUZZ_COVERAGE", "owner")
CALLERS = ("owner", "editor", "member")
# Per caller, so a stall fails the test instead of hanging CI: 10 minutes up to the CI budget,
# more for a larger one.
WALL_CLOCK_S = 24 * max(EXAMPLES_PER_OPERATION, 25)
# The test's own limit (pytest-timeout) leaves the seeding and the server's start time beyond
# schemathesis's, so a stall ends in the report above rather than in a bare timeout.
TEST_TIMEOUT_S = WALL_CLOCK_S + 300

FRAGILE = {"name": "fragile", "input_schema": {"type": "object"}, "steps": [
    {"name": "call", "type": "tool", "tool": "core.echo"},
    {"name": "after", "type": "tool", "tool": "core.echo", "after": ["call"]}]}
PARENT = {"name": "parent", "input_schema": {"type": "object"},
          "steps": [{"name": "child", "type": "sub_workflow", "workflow": "fragile", "input": {}}]}


@pytest.fixture(scope="module")
def server(django_db_setup):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Beside other test files, a Celery worker another file started may run the seeded
        # runs' steps while the seeding drives them itself.
        pytest.skip("the fuzzer runs in a pytest session of its own: pytest -p no:xdist -m fuzz")
    live = LiveServer("fuzz").start()
    yield live
    live.stop()  # before the test database is dropped: PostgreSQL refuses while it is connected
    purge_queues()


def purge_queues() -> None:
    """Drop the work the web process and the seeding sent: no worker of this session ran it,
    and a later session's workers must not receive it."""
    with celery_app.connection_for_write() as conn:
        channel = conn.default_channel
        for name in [*queues("all"), "audit", "celery"]:
            try:
                channel.queue_purge(name)
            except Exception:  # noqa: BLE001 - a queue nobody declared has nothing to purge
                pass


def fail_first_step(run: Run) -> Run:
    step = run.steps.order_by("position").first()
    claim = step_claim(step_id=step.id, worker="fuzz-seed")
    step_fail(step_id=step.id, attempt=claim.attempt, error=StepError("permanent", "boom"),
              usage=Usage(), worker="fuzz-seed")
    return Run.objects.get(pk=run.pk)


def seed() -> dict[str, User]:
    """A team with an object in every state the API shows; returns its three callers."""
    team = TeamFactory(slug="support", name="Support")
    owner = member(team, "fuzz-owner", role=Role.OWNER, groups=("support_leads",))
    plain = member(team, "fuzz-member", role=Role.MEMBER)
    editor = member(team, "fuzz-editor", role=Role.EDITOR)
    other = TeamFactory(slug="other", name="Other")
    member(other, "outsider")

    for path in sorted(EXAMPLES.glob("*.yaml")):  # saved by a person: created_by is set
        workflow_save(team=team, definition=parse_definition_text(path.read_text()), actor=owner)
    fragile, _ = workflow_save(team=team, definition=FRAGILE, actor=SETUP)  # created_by null
    paused, _ = workflow_save(team=team, definition={**FRAGILE, "name": "fragile-pause",
                                                     "on_error": "pause"}, actor=SETUP)
    parent, _ = workflow_save(team=team, definition=PARENT, actor=SETUP)

    drive_to_gate(support_run(team, owner))  # pending approval
    lead = member(team, "fuzz-lead", role=Role.MEMBER, groups=("support_leads",))  # not the starter
    granted = gate(drive_to_gate(support_run(team, owner)))
    approval_grant(approval_id=granted.id, user=lead, proposal_hash=granted.proposal_hash,
                   note="fine")
    rejected = gate(drive_to_gate(support_run(team, owner)))
    approval_reject(approval_id=rejected.id, user=lead, proposal_hash=rejected.proposal_hash,
                    note="no")
    late = drive_to_gate(support_run(team, owner))  # timed out at its gate: approval cancelled
    Run.objects.filter(pk=late.pk).update(deadline_at=now() - timedelta(seconds=1))
    run_time_out(run_id=late.id)
    run_cancel(run_id=support_run(team, owner).id, actor=owner)

    fail_first_step(run_start(version=fragile, input={}, actor=owner))  # open dead letter
    redriven = fail_first_step(run_start(version=fragile, input={"n": 1}, actor=owner))
    dead_letter_redrive(dead_letter_id=DeadLetter.objects.get(run=redriven).id, actor=owner)
    fail_first_step(run_start(version=paused, input={}, actor=owner))  # paused, step failed
    run_start(version=fragile, input={"by": "engine"}, actor=SETUP)  # created_by null
    start_children(run_start(version=parent, input={}, actor=owner))  # a child with parent_run

    assert set(ApprovalRequest.objects.values_list("state", flat=True)) == {
        "pending", "approved", "rejected", "cancelled"}
    assert {"timed_out", "cancelled", "paused", "failed", "waiting"} <= set(
        Run.objects.values_list("state", flat=True))
    assert set(DeadLetter.objects.values_list("status", flat=True)) == {"open", "redriven"}
    assert Run.objects.filter(parent_step__isnull=False).exists()
    seed_evaluations(owner)
    return {"owner": owner, "editor": editor, "member": plain}


def seed_evaluations(owner: User) -> None:
    """The refund example's sample dataset, an evaluation of it that completed (its scores
    written out) and one still running, and a release policy naming the dataset."""
    from evaluation.gate import release_policy_set
    from evaluation.services import dataset_cases_add, dataset_create
    from tests.evaluation.canned import scored, started
    from tests.evaluation.conftest import sample_cases

    dataset = dataset_create(workflow=Workflow.objects.get(name="refund-proposal"), name="golden", actor=owner)
    dataset_cases_add(dataset=dataset, cases=sample_cases(), actor=owner)
    scored(started(dataset, owner), bad={"never-arrived-01"}, unauthorized={"never-arrived-02"})
    started(dataset, owner, note="still running")
    release_policy_set(workflow=dataset.workflow, dataset=dataset, actor=owner,
                       thresholds={"tiers": {"high": {"unauthorized_actions": {"max": 0}}}})


def gate(run: Run) -> ApprovalRequest:
    return ApprovalRequest.objects.get(run=run)


def with_seeded_ids(config: Path) -> Path:
    """schemathesis.toml, plus dictionaries of the seeded objects' ids and names.

    Path parameters drawn at random name nothing that exists, so most requests would end in a
    404 before any view's logic runs; with these, about half of them name a real run, step,
    approval, dead letter, workflow or version, in whatever state the seeding left it.
    """
    values = {
        "runs": [str(pk) for pk in Run.objects.values_list("id", flat=True)],
        "steps": sorted(set(StepRun.objects.values_list("name", flat=True))),
        "approvals": list(ApprovalRequest.objects.values_list("id", flat=True)),
        "letters": list(DeadLetter.objects.values_list("id", flat=True)),
        "workflows": sorted(set(Workflow.objects.values_list("name", flat=True))),
        "numbers": sorted({str(n) for n in WorkflowVersion.objects.values_list("number", flat=True)}),
        "teams": ["support", "other"],
        "datasets": list(Dataset.objects.values_list("id", flat=True)),
        "evaluations": list(Evaluation.objects.values_list("id", flat=True)),
    }
    bindings = {
        r"^/api/v1/runs/\\{id\\}/": {"path.id": "runs", "path.step": "steps"},
        r"^/api/v1/approvals/\\{id\\}/": {"path.id": "approvals"},
        r"^/api/v1/dead-letters/\\{id\\}/": {"path.id": "letters"},
        r"^/api/v1/workflows/\\{name\\}/": {"path.name": "workflows", "path.number": "numbers"},
        r"^/api/v1/datasets/\\{id\\}/": {"path.id": "datasets"},
        r"^/api/v1/evaluations/\\{id\\}/": {"path.id": "evaluations"},
    }

    def binding(dictionary: str) -> str:
        return f'{{ dictionary = "{dictionary}", probability = 0.5 }}'

    lines = [Path(ROOT, "schemathesis.toml").read_text(), "# The seeded objects (generated)."]
    for name, entries in values.items():
        lines += [f"[dictionaries.{name}]", f"values = {json.dumps(entries)}"]
    lines += ["[parameters]", f'"query.team" = {binding("teams")}',
              f'"query.workflow" = {binding("workflows")}', f'"query.run" = {binding("runs")}',
              f'"query.dataset" = {binding("datasets")}']
    for regex, parameters in bindings.items():
        inline = ", ".join(f'"{key}" = {binding(d)}' for key, d in parameters.items())
        lines += ["[[operations]]", f'include-path-regex = "{regex}"', f"parameters = {{ {inline} }}"]
    config.write_text("\n".join(lines) + "\n")
    return config


def phases(caller: str, coverage_callers: str = COVERAGE_CALLERS) -> list[str]:
    """Every phase, or every one but the coverage phase for a caller STEPWISE_FUZZ_COVERAGE
    leaves out."""
    chosen = CALLERS if coverage_callers == "all" else coverage_callers.split(",")
    unknown = set(chosen) - set(CALLERS)
    if unknown:
        raise ValueError(f"STEPWISE_FUZZ_COVERAGE names no caller {sorted(unknown)}: "
                         f"'all' or some of {', '.join(CALLERS)}")
    return ["examples", *(["coverage"] if caller in chosen else []), "fuzzing", "stateful"]


def schemathesis_run(server: LiveServer, caller: str, token: str,
                     tmp_path: Path) -> subprocess.CompletedProcess:
    config = with_seeded_ids(tmp_path / "schemathesis.toml")
    cmd = [Path(sys.executable).with_name("schemathesis"), "--config-file", config, "run",
           f"{server.url}/api/v1/schema/", "--header", f"Authorization: Token {token}",
           "--max-examples", str(EXAMPLES_PER_OPERATION), "--phases", ",".join(phases(caller))]
    if SEED != "random":
        cmd += ["--seed", SEED]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=WALL_CLOCK_S,
                          env={**os.environ, "NO_COLOR": "1"})


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("caller", CALLERS)
def test_every_response_matches_the_published_schema(server, caller, tmp_path):
    user = seed()[caller]
    token = Token.objects.create(user=user).key

    report = Path(server.log.parent, f"fuzz-{caller}.txt")
    try:
        result = schemathesis_run(server, caller, token, tmp_path)
    except subprocess.TimeoutExpired as stalled:
        partial = stalled.stdout or b""  # bytes on POSIX, even with text=True
        report.write_text(partial.decode(errors="replace") if isinstance(partial, bytes) else partial)
        pytest.fail(f"schemathesis did not finish within {WALL_CLOCK_S}s as the {caller}: a "
                    f"request stalled, or the budget is too large (report so far: {report})",
                    pytrace=False)

    report.write_text(result.stdout + result.stderr)
    assert ("Coverage (in" in result.stdout) == ("coverage" in phases(caller)), result.stdout[-3000:]
    server_log = server.errors_logged()
    if result.returncode != 0:
        pytest.fail(f"schemathesis found problems as the {caller} (seed {SEED}; the whole "
                    f"report is in {report}):\n{result.stdout[-20000:]}\n{result.stderr[-3000:]}",
                    pytrace=False)
    assert "Traceback" not in server_log, server_log[-5000:]
