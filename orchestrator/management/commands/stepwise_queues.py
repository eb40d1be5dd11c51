"""Print the Celery queues of a worker family: orchestrator, tools, agent (one per model), all."""
from django.conf import settings
from django.core.management.base import BaseCommand


def queues(family: str) -> list[str]:
    agents = [f"agent.{model}" for model in settings.STEPWISE_MODELS]
    return {"orchestrator": ["orchestrator"], "tools": ["tools"], "agent": agents,
            "all": ["orchestrator", "tools", *agents]}[family]


class Command(BaseCommand):
    help = "Print the comma-separated queue names a worker of FAMILY should consume."

    def add_arguments(self, parser):
        parser.add_argument("family", choices=["orchestrator", "tools", "agent", "all"])

    def handle(self, *args, family: str, **options):
        self.stdout.write(",".join(queues(family)))
