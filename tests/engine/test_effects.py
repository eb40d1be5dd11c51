"""The effect ledger: an effect happens at most once per key, and uncertainty is reconciled."""
import pytest

from orchestrator.models import Effect, StepRun
from orchestrator.retry import StepError
from orchestrator.services.effects import effect_perform
from orchestrator.services.runs import run_cancel, run_start
from orchestrator.services.workflows import workflow_save
from orchestrator.tools.registry import Tool
from tests.factories import SETUP

pytestmark = pytest.mark.django_db

DEFINITION = {"name": "effects", "input_schema": {"type": "object"},
              "steps": [{"name": "act", "type": "tool", "tool": "core.echo", "side_effect": True}]}


@pytest.fixture
def step(team):
    version, _ = workflow_save(team=team, definition=DEFINITION, actor=SETUP)
    run = run_start(version=version, input={}, actor=SETUP)
    return StepRun.objects.select_related("run").get(run=run, name="act")


class Remote:
    """A remote API: counts the calls that reached it."""

    def __init__(self, *, fail_with: StepError | None = None):
        self.calls = 0
        self.fail_with = fail_with

    def __call__(self):
        self.calls += 1
        if self.fail_with:
            raise self.fail_with
        return {"n": self.calls}


def tool(**kwargs) -> Tool:
    return Tool("t", lambda p, c: None, {"type": "object"}, **kwargs)


def test_replay_of_a_succeeded_effect_returns_the_stored_result_without_calling(step):
    remote = Remote()
    first = effect_perform(tool=tool(), call=remote, step_id=step.id, key="k")
    again = effect_perform(tool=tool(), call=remote, step_id=step.id, key="k")
    assert first == again == {"n": 1} and remote.calls == 1
    assert Effect.objects.get(key="k").status == "succeeded"


def test_a_classified_failure_is_recorded_and_may_be_tried_again(step):
    failing = Remote(fail_with=StepError("transient", "HTTP 503"))
    with pytest.raises(StepError):
        effect_perform(tool=tool(), call=failing, step_id=step.id, key="k")
    assert Effect.objects.get(key="k").status == "failed"
    assert effect_perform(tool=tool(), call=Remote(), step_id=step.id, key="k") == {"n": 1}
    assert Effect.objects.get(key="k").attempts == 2


def _uncertain(step, key="k"):
    """A previous attempt started the effect and died before recording its outcome."""
    Effect.objects.create(key=key, run=step.run, step=step, tool="t")


def test_uncertain_effect_found_by_lookup_is_not_repeated(step):
    _uncertain(step)
    remote = Remote()
    result = effect_perform(tool=tool(lookup=lambda key: {"found": key}), call=remote, step_id=step.id, key="k")
    assert result == {"found": "k"} and remote.calls == 0


def test_uncertain_effect_absent_by_lookup_is_performed(step):
    _uncertain(step)
    remote = Remote()
    effect_perform(tool=tool(lookup=lambda key: None), call=remote, step_id=step.id, key="k")
    assert remote.calls == 1


def test_uncertain_effect_on_a_remote_that_dedupes_by_key_is_sent_again_with_the_key(step):
    _uncertain(step)
    remote = Remote()
    effect_perform(tool=tool(dedupes_by_key=True), call=remote, step_id=step.id, key="k")
    assert remote.calls == 1


def test_uncertain_effect_without_a_way_to_reconcile_is_never_repeated_blindly(step):
    _uncertain(step)
    remote = Remote()
    with pytest.raises(StepError) as raised:
        effect_perform(tool=tool(), call=remote, step_id=step.id, key="k")
    assert raised.value.error_class == "uncertain" and remote.calls == 0


def test_no_effect_starts_once_the_run_is_being_cancelled(step):
    run_cancel(run_id=step.run_id, actor=SETUP)
    remote = Remote()
    with pytest.raises(StepError) as raised:
        effect_perform(tool=tool(), call=remote, step_id=step.id, key="k")
    assert raised.value.error_class == "cancelled" and remote.calls == 0
    assert not Effect.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_reconciling_lookup_runs_outside_any_transaction(team):
    """A lookup is a network call: no transaction (and no row lock) may be held across it."""
    from django.db import connection

    # The run waits at a gate, so no worker (one may consume this process's broker) runs `act`.
    waiting = {**DEFINITION, "steps": [
        {"name": "gate", "type": "human_gate", "approvers": "leads"},
        {**DEFINITION["steps"][0], "after": ["gate"]}]}
    version, _ = workflow_save(team=team, definition=waiting, actor=SETUP)
    run = run_start(version=version, input={}, actor=SETUP)
    step = StepRun.objects.select_related("run").get(run=run, name="act")
    _uncertain(step)
    seen = []

    def lookup(key):
        seen.append(connection.in_atomic_block)
        return None

    effect_perform(tool=tool(lookup=lookup), call=Remote(), step_id=step.id, key="k")

    assert seen == [False]
    assert Effect.objects.get(key="k").status == "succeeded"


# --- fencing: an attempt whose claim was superseded writes nothing -----------------------------


def test_a_stale_attempt_resumed_after_a_newer_one_took_the_effect_over_cannot_record_its_outcome(step):
    """Attempt 1 started the call and stalled; attempt 2 reconciled it (the remote dedupes by
    key), called and succeeded. Attempt 1's late answer must not overwrite attempt 2's result."""
    remote = Remote()
    stalled: dict = {}

    def first_call():  # attempt 2 runs while attempt 1 is still "in its call"
        stalled["newer"] = effect_perform(tool=tool(dedupes_by_key=True), call=remote,
                                          step_id=step.id, key="k", fence=2)
        return {"late": True}

    with pytest.raises(StepError) as refused:
        effect_perform(tool=tool(dedupes_by_key=True), call=first_call, step_id=step.id, key="k",
                       fence=1)
    assert refused.value.error_class == "stale"
    effect = Effect.objects.get(key="k")
    assert (effect.status, effect.fence, effect.result) == ("succeeded", 2, {"n": 1})
    assert stalled["newer"] == {"n": 1} and remote.calls == 1


def test_an_older_token_may_not_restart_or_reconcile_an_effect_a_newer_attempt_holds(step):
    failing = Remote(fail_with=StepError("transient", "HTTP 503"))
    with pytest.raises(StepError):
        effect_perform(tool=tool(dedupes_by_key=True), call=failing, step_id=step.id, key="k", fence=3)
    remote = Remote()
    with pytest.raises(StepError) as refused:
        effect_perform(tool=tool(dedupes_by_key=True), call=remote, step_id=step.id, key="k", fence=2)
    assert refused.value.error_class == "stale" and remote.calls == 0
    assert Effect.objects.get(key="k").attempts == 1


def test_an_attempt_whose_claim_no_longer_holds_starts_no_effect(step):
    remote = Remote()
    with pytest.raises(StepError) as refused:
        effect_perform(tool=tool(), call=remote, step_id=step.id, key="k", fence=1,
                       holds=lambda: False)
    assert refused.value.error_class == "stale" and remote.calls == 0
    assert not Effect.objects.filter(key="k").exists()
