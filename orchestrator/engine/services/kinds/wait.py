"""Wait steps: a run waits, holding no worker, for a named signal whose payload is the output.

`start` renders the step's `correlation_key` over its input (a key that does not render fails
the step `permanent`), sets it waiting until `timeout_s` from now with that key persisted
(`StepRun.correlation_key`, which a trigger's correlated event finds it by), and consumes at
once the oldest signal for its name that was buffered before it started (`signals.signal_take`).
Signals that arrive while it waits complete it through `signals.signal_send`. The reaper times
it out (`time_out`) under its run's lock, after checking it still waits, so a signal and a sweep
racing end it once: `on_timeout: fail` times the step out (class `timeout`), `continue`
completes it with {"timed_out": true}, and a step name times it out and the scheduler runs that
step alone after it (`scheduler.timeout_route`). A wait owns nothing: a run that is cancelled
or times out cancels it like any waiting step, and the signals it buffered stay on record.
"""

from django.db import transaction

from orchestrator.models import Run, StepRun
from orchestrator.store import save_row

from ...authz import REAPER, label
from ...definitions import TemplateError, render_template
from ...definitions.limits import MAX_SIGNAL_KEY_CHARS
from ...events import event_record
from ...scheduler import TIMED_OUT_OUTPUT
from ...selectors import lock_run_of_step, spec_of
from ...states import StepKind, StepState
from ..signals import signal_take
from ..step_end import step_ended
from . import Record, StepKindHandler, register


class WaitKeyInvalid(ValueError):
    """A correlation key that does not render to a usable key: a permanent failure."""


def correlation_key_of(spec: dict, step_input: dict) -> str:
    """The step's correlation key rendered over its input ("" without one). Raises
    WaitKeyInvalid for one that fails to render, renders empty or too long."""
    template = spec.get("correlation_key")
    if not template:
        return ""
    try:
        key = render_template(template, step_input).strip()
    except TemplateError as exc:
        raise WaitKeyInvalid(f"correlation_key could not be rendered: {exc}") from None
    if not key or len(key) > MAX_SIGNAL_KEY_CHARS:
        raise WaitKeyInvalid(f"correlation_key rendered {len(key)} characters; it must be 1 to "
                             f"{MAX_SIGNAL_KEY_CHARS}")
    return key


class Wait(StepKindHandler):
    def start(self, run: Run, step: StepRun, spec: dict, record: Record) -> None:
        try:
            key = correlation_key_of(spec, step.input or {})
        except WaitKeyInvalid as exc:
            step.fail(error={"class": "permanent", "message": str(exc)})
            record(step, "step.failed", step.error)
            return
        step.await_signal(timeout_s=spec["timeout_s"], correlation_key=key)
        record(step, "step.waiting", {"for": "signal", "signal": spec["signal"],
                                      "until": step.deadline_at.isoformat(),
                                      **({"correlation_key": key} if key else {})})
        if (signal := signal_take(run, step, spec)) is not None:
            step.complete(output=signal.payload)
            record(step, "step.completed", {"signal": signal.name, "key": signal.key,
                                            "output": signal.payload, "buffered": True})

    def time_out(self, *, step_id: int, reason: str) -> bool:
        """No signal came in time: fail, continue or route, as the step's `on_timeout` says.
        False if it no longer waits (its signal came first, or its run ended)."""
        with transaction.atomic():
            run, step = lock_run_of_step(step_id)
            if step.kind != StepKind.WAIT or step.state != StepState.WAITING:
                return False
            spec = spec_of(run, step.name)
            message = f"no signal '{spec['signal']}' within {spec['timeout_s']} s"
            if spec["on_timeout"] == "continue":
                step.complete(output=TIMED_OUT_OUTPUT)
                kind, payload = "step.completed", {"timed_out": True, "message": message}
            else:
                step.time_out(error={"class": "timeout", "message": message})
                kind, payload = "step.timed_out", step.error
                if spec["on_timeout"] != "fail":
                    payload = {**payload, "routed_to": spec["on_timeout"]}
            save_row(step)
            event_record(run=run, step=step, kind=kind, actor=label(REAPER), payload=payload)
            step_ended(run, step, actor=REAPER)
        return True


register(StepKind.WAIT, Wait())
