"""Router steps on a worker: one route chosen by rules, by score or by a model
(`executors.router`).

The choice is the step's output, and the scheduler skips the branches not chosen. A router needs
nothing beyond the machinery every worker kind shares (`worker`): it has no side effect, and an
LLM router's one call is reserved with its attempt and settled when the attempt ends.
"""
from ...states import StepKind
from . import register
from .worker import WorkerStep


class RouterStep(WorkerStep):
    pass


register(StepKind.ROUTER, RouterStep())
