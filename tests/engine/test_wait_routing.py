"""How the scheduler reads a wait step's end (pure, no database): its signal runs the steps
after it and skips the one its `on_timeout` names; its timeout, when it routes, runs that step
alone, counts as completed with {"timed_out": true} and does not fail the run; a timeout that
does not route breaks the run as any timed-out step."""
from orchestrator.engine.definitions import normalize_definition
from orchestrator.engine.scheduler import StepView, plan


def definition(on_timeout="cancel", on_error="fail"):
    return normalize_definition({
        "name": "t", "input_schema": {"type": "object"}, "on_error": on_error, "steps": [
            {"name": "pay", "type": "wait", "signal": "paid", "on_timeout": on_timeout},
            {"name": "ship", "type": "tool", "tool": "core.echo", "after": ["pay"]},
            {"name": "cancel", "type": "tool", "tool": "core.echo", "after": ["pay"]},
        ]})


def views(pay: StepView):
    return {"pay": pay, "ship": StepView("blocked"), "cancel": StepView("blocked")}


def test_a_signal_runs_the_steps_after_the_wait_and_skips_its_timeout_route():
    p = plan(definition(), {}, views(StepView("completed", {"amount": 3})))
    assert p.skip == [("cancel", "'pay' received its signal")]
    assert [(n, i["steps"]["pay"]) for n, i in p.ready] == [
        ("ship", {"state": "completed", "output": {"amount": 3}})]


def test_a_routed_timeout_runs_only_its_route_which_sees_timed_out():
    p = plan(definition(), {}, views(StepView("timed_out")))
    assert p.skip == [("ship", "'pay' timed out: routed to 'cancel'")]
    assert [(n, i["steps"]["pay"]) for n, i in p.ready] == [
        ("cancel", {"state": "completed", "output": {"timed_out": True}})]
    assert p.outcome == "resume"


def test_a_routed_timeout_does_not_fail_the_run():
    p = plan(definition(), {}, {"pay": StepView("timed_out"), "ship": StepView("skipped"),
                                "cancel": StepView("completed", {"ok": True})})
    assert p.outcome == "complete"


def test_a_timeout_that_fails_breaks_the_run():
    p = plan(definition(on_timeout="fail"), {}, views(StepView("timed_out")))
    assert p.ready == [] and p.outcome == "fail"
    assert p.detail["message"] == "step 'pay' ended timed_out"


def test_a_waiting_wait_holds_the_run_in_waiting():
    p = plan(definition(), {}, views(StepView("waiting")))
    assert (p.ready, p.skip, p.outcome) == ([], [], "wait")
