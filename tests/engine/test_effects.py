"""The effect ledger: an effect happens at most once per key, and uncertainty is reconciled."""
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from orchestrator.engine.retry import StepError
from orchestrator.engine.services.effects import effect_perform
from orchestrator.engine.services.runs import run_cancel, run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.integrations.tools.registry import Tool
from orchestrator.models import Effect, Event, Run, StepRun
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
    assert refused.value.message == "attempt 1 no longer holds its claim; effect k is another attempt's"
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
    assert refused.value.message == "attempt 2 no longer holds its claim; effect k is another attempt's"
    assert Effect.objects.get(key="k").attempts == 1


def test_an_attempt_whose_claim_no_longer_holds_starts_no_effect(step):
    remote = Remote()
    with pytest.raises(StepError) as refused:
        effect_perform(tool=tool(), call=remote, step_id=step.id, key="k", fence=1,
                       holds=lambda: False)
    assert refused.value.error_class == "stale" and remote.calls == 0
    assert not Effect.objects.filter(key="k").exists()


def test_a_concurrent_attempt_with_the_same_token_cannot_overwrite_a_recorded_success(step):
    """Unfenced callers (token 0) share a token: a late answer must still not overwrite the
    success another caller recorded while this one was in its call."""
    remote = Remote()
    inner: dict = {}

    def first_call():
        inner["result"] = effect_perform(tool=tool(dedupes_by_key=True), call=remote,
                                         step_id=step.id, key="k")
        return {"late": True}

    with pytest.raises(StepError) as refused:
        effect_perform(tool=tool(dedupes_by_key=True), call=first_call, step_id=step.id, key="k")
    assert refused.value.error_class == "stale"
    effect = Effect.objects.get(key="k")
    assert (effect.status, effect.result) == ("succeeded", {"n": 1}) and remote.calls == 1


def test_a_stale_attempt_cannot_record_over_a_newer_attempt_that_failed(step):
    """Attempt 2 took the effect over while attempt 1 was in its call, and failed: attempt 1's
    late success must not replace attempt 2's outcome either."""
    newer = Remote(fail_with=StepError("transient", "HTTP 503"))

    def first_call():
        with pytest.raises(StepError):
            effect_perform(tool=tool(dedupes_by_key=True), call=newer, step_id=step.id, key="k",
                           fence=2)
        return {"late": True}

    with pytest.raises(StepError) as refused:
        effect_perform(tool=tool(dedupes_by_key=True), call=first_call, step_id=step.id, key="k",
                       fence=1)
    assert refused.value.error_class == "stale"
    effect = Effect.objects.get(key="k")
    assert (effect.status, effect.fence, effect.result) == ("failed", 2, None)


def test_finishing_one_effect_leaves_the_others_of_the_attempt_alone(step):
    """Two effects of one attempt (same token), the second performed while the first is still in
    its call: each records its own outcome."""

    def first_call():
        assert effect_perform(tool=tool(), call=lambda: {"second": True}, step_id=step.id,
                              key="second") == {"second": True}
        assert Effect.objects.get(key="first").status == "started"
        return {"first": True}

    assert effect_perform(tool=tool(), call=first_call, step_id=step.id, key="first") == {"first": True}
    assert dict(Effect.objects.values_list("key", "result")) == {"first": {"first": True},
                                                                 "second": {"second": True}}


def _queries(perform) -> tuple[list[str], list[str]]:
    """(the SQL run before the call, all the SQL run) of `perform(call)`."""
    before_call: list[str] = []
    with CaptureQueriesContext(connection) as queries:
        def call():
            before_call.extend(query["sql"] for query in queries.captured_queries)
            return {"n": 1}

        perform(call)
    return before_call, [query["sql"] for query in queries.captured_queries]


def test_the_ledger_reads_a_step_without_its_input_before_a_first_call(step):
    """A step's input may be large, and the ledger's first read precedes every effect."""
    before_call, _ = _queries(lambda call: effect_perform(tool=tool(), call=call, step_id=step.id,
                                                         key="k"))
    steps_read = [sql for sql in before_call if 'FROM "orchestrator_steprun"' in sql]
    assert steps_read and not [sql for sql in steps_read if '"orchestrator_steprun"."input"' in sql
                               or '"orchestrator_steprun"."output"' in sql]


def test_the_ledger_reads_a_step_and_its_run_in_one_query(step):
    """On every path (a first call, a reconciled one) the run comes joined to the step or the
    effect, never in a query of its own."""
    _uncertain(step)
    for key, lookup in (("fresh", None), ("k", lambda key: None)):
        _, queries = _queries(lambda call, key=key, lookup=lookup: effect_perform(
            tool=tool(lookup=lookup), call=call, step_id=step.id, key=key))
        assert not [sql for sql in queries if 'FROM "orchestrator_run"' in sql]
        assert not [sql for sql in queries if 'FROM "orchestrator_steprun"' in sql
                    and 'JOIN "orchestrator_run"' not in sql]


# --- what the ledger records ------------------------------------------------------------------


def _events(step) -> list[tuple[str, dict]]:
    return [(event.kind, event.payload)
            for event in Event.objects.filter(step=step, kind__startswith="effect.").order_by("id")]


def test_a_first_call_records_the_effect_and_its_outcome(step):
    remote = Remote()
    result = effect_perform(tool=tool(), call=remote, step_id=step.id, key="k", action="compensate",
                            fence=4, holds=lambda: True)
    effect = Effect.objects.get(key="k")
    assert result == {"n": 1}
    assert (effect.run_id, effect.step_id, effect.tool, effect.action) == (step.run_id, step.id, "t",
                                                                         "compensate")
    assert (effect.status, effect.attempts, effect.fence, effect.result, effect.error) == (
        "succeeded", 1, 4, {"n": 1}, None)
    assert effect.finished_at is not None and effect.finished_at >= effect.started_at
    assert _events(step) == [
        ("effect.started", {"key": "k", "tool": "t", "action": "compensate"}),
        ("effect.succeeded", {"key": "k", "tool": "t", "action": "compensate"}),
    ]


def test_an_unfenced_call_records_the_default_action_and_token_0(step):
    effect_perform(tool=tool(), call=Remote(), step_id=step.id, key="k")
    effect = Effect.objects.get(key="k")
    assert (effect.action, effect.fence) == ("default", 0)  # an unfenced caller: token 0
    assert _events(step)[0] == ("effect.started", {"key": "k", "tool": "t", "action": "default"})


def test_a_failure_is_stored_scrubbed_and_recorded_with_its_error(step):
    failing = Remote(fail_with=StepError("permanent", "card 4242 declined"))
    with pytest.raises(StepError) as raised:
        effect_perform(tool=tool(), call=failing, step_id=step.id, key="k",
                       scrub=lambda value: {"scrubbed": value})
    assert raised.value.message == "card 4242 declined"  # the caller sees the error unscrubbed
    stored = {"scrubbed": {"class": "permanent", "message": "card 4242 declined"}}
    effect = Effect.objects.get(key="k")
    assert (effect.status, effect.error, effect.result) == ("failed", stored, None)
    assert effect.finished_at is not None
    assert _events(step)[-1] == ("effect.failed", {"key": "k", "tool": "t", "action": "default",
                                                   "error": stored})


def test_a_success_is_stored_scrubbed_but_returned_as_the_tool_gave_it(step):
    result = effect_perform(tool=tool(), call=Remote(), step_id=step.id, key="k",
                            scrub=lambda value: "***")
    assert result == {"n": 1}
    assert Effect.objects.get(key="k").result == "***"


def test_a_replay_records_that_it_replayed_and_calls_nothing(step):
    remote = Remote()
    effect_perform(tool=tool(), call=remote, step_id=step.id, key="k")
    effect_perform(tool=tool(), call=remote, step_id=step.id, key="k")
    assert remote.calls == 1
    assert _events(step)[-1] == ("effect.replayed", {"key": "k", "tool": "t"})
    assert [kind for kind, _ in _events(step)].count("effect.started") == 1


def test_a_recorded_success_is_replayed_even_to_an_older_token(step):
    """A success is final: whoever asks again — even an attempt whose claim was superseded —
    gets the stored result and the remote is never called again."""
    remote = Remote()
    effect_perform(tool=tool(), call=remote, step_id=step.id, key="k", fence=3)
    assert effect_perform(tool=tool(), call=remote, step_id=step.id, key="k", fence=2) == {"n": 1}
    assert effect_perform(tool=tool(), call=remote, step_id=step.id, key="k", fence=3) == {"n": 1}
    assert remote.calls == 1


def test_a_retry_after_a_failure_restarts_the_effect_under_the_new_token(step):
    failing = Remote(fail_with=StepError("transient", "HTTP 503"))
    with pytest.raises(StepError):
        effect_perform(tool=tool(), call=failing, step_id=step.id, key="k", fence=1)
    seen: dict = {}

    def call():  # during the second call the row says: started again, by attempt 2
        effect = Effect.objects.get(key="k")
        seen.update(status=effect.status, fence=effect.fence, attempts=effect.attempts,
                    error=effect.error)
        return {"ok": True}

    assert effect_perform(tool=tool(), call=call, step_id=step.id, key="k", fence=2) == {"ok": True}
    assert seen == {"status": "started", "fence": 2, "attempts": 2, "error": None}
    effect = Effect.objects.get(key="k")
    assert (effect.status, effect.fence, effect.attempts, effect.error) == ("succeeded", 2, 2, None)


def test_the_same_token_may_try_a_failed_effect_again(step):
    failing = Remote(fail_with=StepError("transient", "HTTP 503"))
    with pytest.raises(StepError):
        effect_perform(tool=tool(), call=failing, step_id=step.id, key="k", fence=2)
    assert effect_perform(tool=tool(), call=Remote(), step_id=step.id, key="k", fence=2) == {"n": 1}
    assert Effect.objects.get(key="k").attempts == 2


def test_an_effect_may_start_while_the_run_compensates(step):
    """Compensation actions are effects too: a compensating run may still start them."""
    Run.objects.filter(id=step.run_id).update(state="compensating")
    assert effect_perform(tool=tool(), call=Remote(), step_id=step.id, key="k",
                          action="compensate") == {"n": 1}


def test_a_claim_that_holds_lets_the_effect_start(step):
    assert effect_perform(tool=tool(), call=Remote(), step_id=step.id, key="k", fence=1,
                          holds=lambda: True) == {"n": 1}


def test_the_cancelled_refusal_names_the_run_state(step):
    run_cancel(run_id=step.run_id, actor=SETUP)
    state = Run.objects.get(id=step.run_id).state
    with pytest.raises(StepError) as raised:
        effect_perform(tool=tool(), call=Remote(), step_id=step.id, key="k")
    assert raised.value.message == f"run is {state}; the effect was not started"


def test_the_stale_refusal_names_the_attempt_and_the_key(step):
    with pytest.raises(StepError) as raised:
        effect_perform(tool=tool(), call=Remote(), step_id=step.id, key="k", fence=7,
                       holds=lambda: False)
    assert raised.value.message == "attempt 7 no longer holds its claim; effect k is another attempt's"


# --- reconciling a lost outcome ----------------------------------------------------------------


def test_a_lost_outcome_found_by_lookup_is_recorded_as_the_result(step):
    _uncertain(step)
    asked = []

    def lookup(key):
        asked.append(key)
        return {"found": key}

    effect_perform(tool=tool(lookup=lookup), call=Remote(), step_id=step.id, key="k")
    effect = Effect.objects.get(key="k")
    assert asked == ["k"]
    assert (effect.status, effect.result, effect.attempts) == ("succeeded", {"found": "k"}, 1)
    assert effect.finished_at is not None
    assert _events(step)[-1] == ("effect.reconciled", {"key": "k", "found": True})
    # Found once, it is a success like any other: never looked up or called again.
    remote = Remote()
    assert effect_perform(tool=tool(lookup=lookup), call=remote, step_id=step.id,
                          key="k") == {"found": "k"}
    assert asked == ["k"] and remote.calls == 0


def test_a_lost_outcome_absent_by_lookup_is_retried_with_the_same_key(step):
    _uncertain(step)
    remote = Remote()
    assert effect_perform(tool=tool(lookup=lambda key: None), call=remote, step_id=step.id,
                          key="k", fence=2) == {"n": 1}
    effect = Effect.objects.get(key="k")
    assert (effect.status, effect.attempts, effect.fence, effect.result) == ("succeeded", 2, 2, {"n": 1})
    assert Effect.objects.count() == 1
    assert [kind for kind, _ in _events(step)] == ["effect.reconciled", "effect.succeeded"]
    assert _events(step)[0] == ("effect.reconciled", {"key": "k", "found": False})


def test_a_lookup_is_trusted_before_the_remote_key_when_a_tool_has_both(step):
    _uncertain(step)
    remote = Remote()
    effect_perform(tool=tool(lookup=lambda key: None, dedupes_by_key=True), call=remote,
                   step_id=step.id, key="k")
    assert remote.calls == 1
    assert _events(step)[0] == ("effect.reconciled", {"key": "k", "found": False})


def test_a_lost_outcome_at_a_remote_that_dedupes_is_resent_and_recorded_so(step):
    _uncertain(step)
    remote = Remote()
    effect_perform(tool=tool(dedupes_by_key=True), call=remote, step_id=step.id, key="k", fence=1)
    effect = Effect.objects.get(key="k")
    assert (remote.calls, effect.status, effect.attempts, effect.fence) == (1, "succeeded", 2, 1)
    assert _events(step)[0] == ("effect.reconciled", {"key": "k", "by": "remote idempotency key"})


def test_an_unreconcilable_outcome_says_why_and_leaves_the_row_untouched(step):
    _uncertain(step)
    with pytest.raises(StepError) as raised:
        effect_perform(tool=tool(), call=Remote(), step_id=step.id, key="k")
    assert raised.value.message == ("effect k may have happened; tool 't' offers no lookup, so a "
                                    "person must reconcile it")
    effect = Effect.objects.get(key="k")
    assert (effect.status, effect.attempts) == ("started", 1)
    assert _events(step) == []


def test_a_lost_outcome_another_attempt_reconciled_as_done_meanwhile_is_not_called_again(step):
    """While this attempt's lookup is on the network, a newer attempt reconciles the effect
    (its own lookup found it): this one takes that verdict and calls nothing."""
    _uncertain(step)
    remote = Remote()

    def slow_lookup(key):  # runs outside any transaction: another attempt finishes meanwhile
        effect_perform(tool=tool(lookup=lambda key: {"found": "by the other"}), call=remote,
                       step_id=step.id, key=key, fence=3)
        return None

    result = effect_perform(tool=tool(lookup=slow_lookup), call=remote, step_id=step.id, key="k",
                            fence=3)
    assert result == {"found": "by the other"} and remote.calls == 0


class _Crash(Exception):
    """A worker dying in the middle of its call: no outcome is recorded."""


def test_a_lost_outcome_another_attempt_is_performing_is_left_to_it(step):
    """While this attempt's lookup is on the network, another attempt restarts the effect (its
    remote dedupes by key) and is still in its call: this one must neither call nor restart."""
    _uncertain(step)
    remote = Remote()

    def crashes():
        raise _Crash

    def slow_lookup(key):
        with pytest.raises(_Crash):
            effect_perform(tool=tool(dedupes_by_key=True), call=crashes, step_id=step.id, key=key)
        return None

    with pytest.raises(StepError) as raised:
        effect_perform(tool=tool(lookup=slow_lookup), call=remote, step_id=step.id, key="k")
    assert raised.value.error_class == "transient"
    assert raised.value.message == "effect k is being performed by another attempt"
    assert remote.calls == 0
    effect = Effect.objects.get(key="k")
    assert (effect.status, effect.attempts) == ("started", 2)
