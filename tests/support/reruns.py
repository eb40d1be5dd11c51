"""What the bulk re-run tests share: a workflow whose first version fails every run and whose
second is fixed, and runs of it driven to their end in this process, as a worker would."""
from orchestrator.engine.services.kinds.worker import step_execute
from orchestrator.engine.services.runs import run_start
from orchestrator.models import Run
from tests.factories import SETUP

SCHEMA = {"type": "object", "required": ["ticket"],
          "properties": {"ticket": {"type": "string"}, "api_token": {"type": "string"}}}


def echo_definition(*, fixed: bool, name: str = "triage") -> dict:
    """One echo step; unfixed, its output schema asks for a field it does not return, so the
    run fails."""
    required = ["ticket"] if fixed else ["ticket", "category"]
    return {"name": name, "input_schema": SCHEMA, "steps": [{
        "name": "echo", "type": "tool", "tool": "core.echo",
        "params": {"ticket": "{{ input.ticket }}"},
        "output_schema": {"type": "object", "required": required,
                          "properties": {"ticket": {"type": "string"}, "category": {"type": "string"}}}}]}


def run_to_end(run: Run) -> Run:
    """Execute the run's queued steps in this process until it has ended."""
    for _ in range(10):
        run.refresh_from_db()
        if run.is_terminal:
            return run
        for step in run.steps.filter(state="queued"):
            step_execute(step_id=step.id, worker="test")
    raise AssertionError(f"run {run.id} did not end: {run.state}")


def failed_runs(version, count: int, **extra) -> list[Run]:
    """`count` runs of `version` (the unfixed one), each ended failed."""
    runs = [run_to_end(run_start(version=version, input={"ticket": f"T-{i}", **extra}, actor=SETUP))
            for i in range(count)]
    assert {run.state for run in runs} == {"failed"}
    return runs
