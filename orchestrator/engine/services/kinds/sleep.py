"""Sleep steps: a run waits for a time, holding no worker.

`start` decides when the step wakes (`timers.wake_time`: `for_s` after it starts, or its
`until` rendered over the step's input and read in its time zone) and sets it waiting with that
time persisted (`StepRun.wake_at`); an `until` that does not make a time fails the step
`permanent`, and a time already past completes it at once. The reaper wakes each step whose
time has come (`sleep_wake`) under its run's lock, after checking again that it still sleeps:
two sweeps at once, or a sweep run again after a crash, complete it once. A sleep owns nothing:
a run that is cancelled or times out cancels it like any waiting step (`steps_stop`), and the
run's duration budget runs on while it sleeps.
"""

from django.db import transaction

from orchestrator.models import Run, StepRun
from orchestrator.store import save_row

from ...authz import REAPER, label
from ...clock import now
from ...events import event_record
from ...selectors import lock_run_of_step
from ...states import StepKind
from ...timers import SleepInvalid, is_due, sleep_output, wake_time
from ..step_end import step_ended, waiting_step_time_out
from . import Record, StepKindHandler, register


class Sleep(StepKindHandler):
    def start(self, run: Run, step: StepRun, spec: dict, record: Record) -> None:
        at = now()
        try:
            wake_at = wake_time(spec, step.input or {}, started_at=at)
        except SleepInvalid as exc:
            step.fail(error={"class": "permanent", "message": str(exc)})
            record(step, "step.failed", step.error)
            return
        step.await_time(wake_at=wake_at)
        record(step, "step.waiting", {"for": "sleep", "until": wake_at.isoformat()})
        if is_due(state=step.state, wake_at=wake_at, at=at):  # a time already past
            step.complete(output=sleep_output(wake_at))
            record(step, "step.completed", step.output)

    def time_out(self, *, step_id: int, reason: str) -> bool:
        # A sleep has no deadline of its own (`await_time`); one set by hand times it out.
        return waiting_step_time_out(step_id=step_id, reason=reason)


register(StepKind.SLEEP, Sleep())


def sleep_wake(*, step_id: int) -> bool:
    """Wake a sleep step whose time has come: it completes with {"slept_until": ...} and its
    run moves on. The reaper's sweep calls it for each step it finds due.

    False, and nothing done, when the step no longer sleeps (woken already, cancelled with its
    run) or its time has not come.
    """
    with transaction.atomic():
        run, step = lock_run_of_step(step_id)
        if step.kind != StepKind.SLEEP or not is_due(
            state=step.state, wake_at=step.wake_at, at=now()
        ):
            return False
        step.complete(output=sleep_output(step.wake_at))
        save_row(step)
        event_record(
            run=run, step=step, kind="step.completed", actor=label(REAPER), payload=step.output
        )
        step_ended(run, step, actor=REAPER)
    return True
