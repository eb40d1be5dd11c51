"""The state vocabulary of runs and steps: every state, and the sets the engine reasons with.

One pure module (no database, no Django models) that the models' state machines, the
scheduler, the services, the reaper and the cancel cascade all read, so "which states are
terminal" or "which runs may be cancelled" is written once. It must not import anything of
Stepwise's.
"""
from django.db.models import TextChoices


class RunState(TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    WAITING = "waiting"
    PAUSED = "paused"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    COMPENSATING = "compensating"
    COMPENSATION_FAILED = "compensation_failed"


# A run in one of these has ended: nothing about it changes any more (but an operator's redrive
# of a failed or timed-out run, which reopens it).
RUN_TERMINAL = frozenset({RunState.CANCELLED, RunState.COMPLETED, RunState.FAILED,
                          RunState.TIMED_OUT, RunState.COMPENSATION_FAILED})
# A live run may start steps, or waits for an event or an operator.
RUN_LIVE = frozenset({RunState.RUNNING, RunState.WAITING, RunState.PAUSED})
# The scheduler moves these forward.
RUN_ADVANCING = frozenset({RunState.RUNNING, RunState.WAITING})
# A cancel is accepted in these. `cancelling` accepts it again (a no-op); a `compensating` run
# refuses it: it is undoing effects already, and ends by itself when that is done.
RUN_CANCELLABLE = frozenset({RunState.PENDING, *RUN_LIVE})
# Side effects may still start (a compensation is one).
RUN_EFFECTS_ALLOWED = frozenset({*RUN_ADVANCING, RunState.COMPENSATING})
# Why a step that a run's end stopped was cancelled (its `skip_reason`), by how the run ended:
# the steps still waiting when it ended, and a running one that stopped after. A retry of the
# run reopens exactly these.
STOPPED_BY_RUN_END = {RunState.FAILED: "run failed", RunState.TIMED_OUT: "run timed out"}


class RunCapacity(TextChoices):
    """The built-in capacity classes a run's work is sent to (docs/operations.md#capacity; an
    operator adds more: `engine/capacity.py`): batch and evaluation runs have queues of their
    own, and evaluation runs are left out of a team's admission caps and spend, so a large
    evaluation never starves live work."""

    INTERACTIVE = "interactive"
    BATCH = "batch"
    EVALUATION = "evaluation"


class StepState(TextChoices):
    BLOCKED = "blocked"
    READY = "ready"
    QUEUED = "queued"
    RUNNING = "running"
    RETRYING = "retrying"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    SKIPPED = "skipped"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


STEP_DONE = frozenset({StepState.COMPLETED, StepState.SKIPPED})
STEP_BROKEN = frozenset({StepState.FAILED, StepState.TIMED_OUT, StepState.CANCELLED})
STEP_TERMINAL = STEP_DONE | STEP_BROKEN
# Holding (or about to hold) a worker; what max_parallel counts.
STEP_ACTIVE = frozenset({StepState.QUEUED, StepState.RUNNING, StepState.RETRYING})
# Not ended; a cancel reaches these.
STEP_OPEN = frozenset({StepState.BLOCKED, StepState.READY, StepState.QUEUED, StepState.RETRYING,
                       StepState.RUNNING, StepState.WAITING})
# Cancelled at once when their run stops; a running step stops at its next safe point instead.
STEP_CANCELLABLE_NOW = STEP_OPEN - {StepState.RUNNING}
# An operator may run these again, or let the run go on without them.
STEP_RECOVERABLE = frozenset({StepState.FAILED, StepState.TIMED_OUT})


class StepKind(TextChoices):
    AGENT = "agent"
    TOOL = "tool"
    ROUTER = "router"
    MAP = "map"
    HUMAN_GATE = "human_gate"
    SUB_WORKFLOW = "sub_workflow"
    LOOP = "loop"
    SLEEP = "sleep"
    HUMAN_INPUT = "human_input"
    WAIT = "wait"


# Run by a worker (claimed under a lease, executed, retried under their policy).
WORKER_KINDS = frozenset({StepKind.AGENT, StepKind.TOOL, StepKind.ROUTER})
# Started by the engine itself; they wait, holding no worker, for an approval, a child run,
# a chord's join, a loop's iterations, a time, a person's answer or a signal, and own that work
# until they end.
CONTROL_KINDS = frozenset({StepKind.HUMAN_GATE, StepKind.SUB_WORKFLOW, StepKind.MAP, StepKind.LOOP,
                           StepKind.SLEEP, StepKind.HUMAN_INPUT, StepKind.WAIT})


def in_order(states: frozenset) -> list:
    """`states` as a list in declaration order: what a transition's `source` takes (django-fsm
    iterates a list, but would take a frozenset for one state)."""
    enum = RunState if all(isinstance(s, RunState) for s in states) else StepState
    return [s for s in enum if s in states]
