"""Print the Celery queues of a worker family: orchestrator, tools, agent (one per model), the
batch side of tools or agent alone, the evaluation side of every family alone, or all; with
`--without-evaluation`, a family's queues but its evaluation side (the Procfile's live workers,
beside a worker of `evaluation` alone)."""
from django.conf import settings
from django.core.management.base import BaseCommand

from orchestrator.engine.capacity import added_class_names
from orchestrator.operations.queues import BATCH_SUFFIX, EVALUATION_SUFFIX


def queues(family: str, *, with_evaluation: bool = True) -> list[str]:
    """Each family's interactive queue and, beside it, the batch queue its map items go to
    (orchestrator.engine.dispatch.batch_queue_for), then its evaluation queue, where every step
    and item of an evaluation run goes; `tools-batch` and `agent-batch` are the batch side
    alone, `evaluation` every evaluation queue alone, for a deployment that gives fan-outs or
    evaluations workers of their own. `with_evaluation=False` leaves the evaluation side out of
    a family's queues (and of `all`), for workers that serve live work alone. A class an
    operator added (engine/capacity.py) is a family of its own: its side of every queue, which
    `all` includes."""
    agents = [f"agent.{model}" for model in settings.STEPWISE_MODELS]
    tools_batch = ["tools" + BATCH_SUFFIX]
    agents_batch = [queue + BATCH_SUFFIX for queue in agents]
    orchestrator_evaluation = ["orchestrator" + EVALUATION_SUFFIX]
    tools_evaluation = ["tools" + EVALUATION_SUFFIX]
    agents_evaluation = [queue + EVALUATION_SUFFIX for queue in agents]
    evaluation = [*orchestrator_evaluation, *tools_evaluation, *agents_evaluation]
    if not with_evaluation:
        orchestrator_evaluation, tools_evaluation, agents_evaluation = [], [], []
    added = {name: [f"{queue}.{name}" for queue in ("orchestrator", "tools", *agents)]
             for name in added_class_names()}
    if family in added:
        return added[family]
    return {"orchestrator": ["orchestrator", *orchestrator_evaluation],
            "tools": ["tools", *tools_batch, *tools_evaluation],
            "agent": [*agents, *agents_batch, *agents_evaluation], "tools-batch": tools_batch,
            "agent-batch": agents_batch, "evaluation": evaluation,
            "all": ["orchestrator", "tools", *tools_batch, *agents, *agents_batch,
                    *(evaluation if with_evaluation else []),
                    *(queue for queues in added.values() for queue in queues)]}[family]


class Command(BaseCommand):
    help = "Print the comma-separated queue names a worker of FAMILY should consume."

    def add_arguments(self, parser):
        parser.add_argument("family", choices=["orchestrator", "tools", "agent", "tools-batch",
                                               "agent-batch", "evaluation", "all",
                                               *added_class_names()])
        parser.add_argument("--without-evaluation", action="store_true",
                            help="leave out the evaluation side (for live workers beside a "
                            "worker of the `evaluation` family)")

    def handle(self, *args, family: str, without_evaluation: bool = False, **options):
        self.stdout.write(",".join(queues(family, with_evaluation=not without_evaluation)))
