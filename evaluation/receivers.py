"""What the evaluation app does when the engine says something happened."""
from .evaluations import advance_later
from .models import EvaluationCase


def on_run_ended(sender, *, run, **kwargs) -> None:
    """An evaluation's run ended: advance its evaluation (score it, start the next case)."""
    evaluation_id = EvaluationCase.objects.filter(run_id=run.id).values_list("evaluation_id", flat=True).first()
    if evaluation_id is not None:
        advance_later(evaluation_id)
