"""Celery tasks of evaluations: thin, each calls one service (evaluation/evaluations.py)."""
from celery import shared_task

from .evaluations import ADVANCE_TASK, evaluation_advance, evaluations_sweep
from .models import Evaluation


@shared_task(name=ADVANCE_TASK, ignore_result=True)
def advance(evaluation_id: int) -> None:
    try:
        evaluation_advance(evaluation_id=evaluation_id)
    except Evaluation.DoesNotExist:  # deleted with its workflow's data since: nothing to advance
        return


@shared_task(name="evaluation.tasks.sweep", ignore_result=True)
def sweep() -> None:
    evaluations_sweep()
