"""Child runs in tests that drive runs in this process: a sub-workflow step only sends the
`child_start` task as it starts (on commit, which a test transaction never reaches), and a
worker creates the child. `start_children` does what that worker does."""
from orchestrator.engine.services.kinds.sub_workflow import child_run_start
from orchestrator.engine.states import StepKind, StepState
from orchestrator.models import Run


def start_children(run: Run, *, depth: int = 10) -> list[Run]:
    """Create the child of every sub-workflow step of `run` that waits for one, and theirs,
    down to `depth` levels; returns `run`'s own children."""
    waiting = run.steps.filter(kind=StepKind.SUB_WORKFLOW, state=StepState.WAITING)
    for step_id in waiting.values_list("id", flat=True):
        child_run_start(parent_step_id=step_id)
    children = list(Run.objects.filter(parent_step__run=run))
    if depth > 1:
        for child in children:
            start_children(child, depth=depth - 1)
    return children
