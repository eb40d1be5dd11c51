"""Dead letters: recording work that exhausted its retries.

Work that fails for good lands in `DeadLetter` (with run, step, error class, attempts, payload
reference and trace id). Nothing leaves it by itself: the way back is an operator's redrive
(`operators.dead_letter_redrive`).
"""
from orchestrator.models import DeadLetter, Run, StepRun

from ..authz import Actor, label
from ..events import event_record
from ..retry import StepError


def dead_letter_open(*, run: Run, step: StepRun, error: StepError, actor: Actor) -> DeadLetter:
    """Record a step that failed for good (inside the failing transaction)."""
    letter = DeadLetter.objects.create(
        run=run, step=step, error_class=error.error_class, error_message=error.message[:2000],
        attempts=step.attempts, payload_ref=f"steprun:{step.id}/input", trace_id=str(run.id),
    )
    event_record(run=run, step=step, kind="step.dead_lettered", actor=label(actor),
                 payload={"dead_letter": letter.id, "class": error.error_class,
                          "attempts": step.attempts})
    return letter
