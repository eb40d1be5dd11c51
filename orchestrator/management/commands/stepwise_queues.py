"""Print the Celery queues of a worker family: orchestrator, tools, agent (one per model), the
batch side of tools or agent alone, or all."""
from django.conf import settings
from django.core.management.base import BaseCommand

from orchestrator.operations.queues import BATCH_SUFFIX


def queues(family: str) -> list[str]:
    """Each family's interactive queue and, beside it, the batch queue its map items go to
    (orchestrator.engine.dispatch.batch_queue_for); `tools-batch` and `agent-batch` are the batch
    side alone, for a deployment that gives fan-outs workers of their own."""
    agents = [f"agent.{model}" for model in settings.STEPWISE_MODELS]
    tools_batch = ["tools" + BATCH_SUFFIX]
    agents_batch = [queue + BATCH_SUFFIX for queue in agents]
    return {"orchestrator": ["orchestrator"], "tools": ["tools", *tools_batch],
            "agent": [*agents, *agents_batch], "tools-batch": tools_batch,
            "agent-batch": agents_batch,
            "all": ["orchestrator", "tools", *tools_batch, *agents, *agents_batch]}[family]


class Command(BaseCommand):
    help = "Print the comma-separated queue names a worker of FAMILY should consume."

    def add_arguments(self, parser):
        parser.add_argument("family", choices=["orchestrator", "tools", "agent", "tools-batch", "agent-batch", "all"])

    def handle(self, *args, family: str, **options):
        self.stdout.write(",".join(queues(family)))
