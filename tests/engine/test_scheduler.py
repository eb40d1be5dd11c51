"""The scheduler is a pure function: each branch is checked without a database or worker."""
import pytest

from orchestrator.definitions import normalize_definition
from orchestrator.scheduler import StepView, graph_of, plan


def definition(*steps, on_error="fail", max_parallel=10):
    return normalize_definition({
        "name": "t", "input_schema": {"type": "object"}, "on_error": on_error,
        "max_parallel": max_parallel, "steps": list(steps),
    })


def tool(name, after=(), **extra):
    return {"name": name, "type": "tool", "tool": "core.echo", "after": list(after), **extra}


def views(**states):
    return {n: (s if isinstance(s, StepView) else StepView(s)) for n, s in states.items()}


def test_roots_become_ready_and_are_enqueued_with_the_run_input():
    d = definition(tool("a"), tool("b", ["a"]))
    p = plan(d, {"x": 1}, views(a="blocked", b="blocked"))
    assert [n for n, _ in p.ready] == ["a"]
    assert p.ready[0][1] == {"input": {"x": 1}, "steps": {}}
    assert p.enqueue == ["a"]
    assert p.outcome == "resume"


def test_step_input_carries_every_upstream_output_by_name():
    d = definition(tool("a"), tool("b", ["a"]), tool("c", ["b"]))
    p = plan(d, {}, views(a=StepView("completed", {"v": 1}), b=StepView("completed", {"v": 2}),
                          c="blocked"))
    assert p.ready == [("c", {"input": {}, "steps": {
        "a": {"state": "completed", "output": {"v": 1}},
        "b": {"state": "completed", "output": {"v": 2}}}})]


def test_step_waits_until_all_dependencies_completed():
    d = definition(tool("a"), tool("b"), tool("c", ["a", "b"]))
    p = plan(d, {}, views(a="completed", b="running", c="blocked"))
    assert p.ready == [] and p.skip == []
    assert p.outcome == "resume"


def test_step_with_false_condition_is_skipped_not_failed():
    d = definition(tool("a"), tool("b", ["a"], when="steps.a.output.go == true"))
    p = plan(d, {}, views(a=StepView("completed", {"go": False}), b="blocked"))
    assert p.skip == [("b", "condition is false: steps.a.output.go == true")]
    assert p.outcome == "complete"


def test_skipped_dependency_skips_dependents_transitively():
    d = definition(tool("a"), tool("b", ["a"], when="false == true"), tool("c", ["b"]), tool("d", ["c"]))
    p = plan(d, {}, views(a="completed", b="blocked", c="blocked", d="blocked"))
    assert [n for n, _ in p.skip] == ["b", "c", "d"]
    assert p.outcome == "complete"


def test_join_any_runs_when_one_dependency_completed_and_the_other_skipped():
    d = definition(tool("a"), tool("b"), tool("c", ["a", "b"], join="any"))
    p = plan(d, {}, views(a="completed", b="skipped", c="blocked"))
    assert [n for n, _ in p.ready] == ["c"]


def test_join_any_skips_when_every_dependency_skipped():
    d = definition(tool("a"), tool("b"), tool("c", ["a", "b"], join="any"))
    p = plan(d, {}, views(a="skipped", b="skipped", c="blocked"))
    assert [n for n, _ in p.skip] == ["c"]


def test_router_skips_branches_not_chosen():
    router = {"name": "r", "type": "router", "routes": [
        {"name": "yes", "when": "input.x > 1", "then": ["y"]}], "default": {"name": "no", "then": ["n"]}}
    d = definition(router, tool("y", ["r"]), tool("n", ["r"]))
    p = plan(d, {}, views(r=StepView("completed", {"route": "no"}), y="blocked", n="blocked"))
    assert p.skip == [("y", "not on route 'no' chosen by 'r'")]
    assert [n for n, _ in p.ready] == ["n"]


@pytest.mark.parametrize("on_error, outcome", [("fail", "fail"), ("pause", "pause"), ("continue", "complete")])
def test_a_failed_step_applies_the_workflow_error_policy(on_error, outcome):
    d = definition(tool("a"), tool("b", ["a"]), on_error=on_error)
    p = plan(d, {}, views(a="failed", b="blocked"))
    assert p.outcome == outcome
    if on_error == "continue":
        assert [n for n, _ in p.skip] == ["b"]
    else:
        assert p.skip == [] and p.ready == []


def test_fallback_runs_only_when_its_primary_failed_and_stands_in_for_it():
    d = definition(tool("a", fallback="fb"), tool("fb"), tool("c", ["a"]))
    waiting = plan(d, {}, views(a="running", fb="blocked", c="blocked"))
    assert waiting.ready == []
    failed = plan(d, {}, views(a="failed", fb="blocked", c="blocked"))
    assert [n for n, _ in failed.ready] == ["fb"] and failed.outcome == "resume"
    rescued = plan(d, {}, views(a="failed", fb=StepView("completed", {"ok": 1}), c="blocked"))
    assert rescued.ready[0][0] == "c"
    assert rescued.ready[0][1]["steps"]["a"] == {"state": "completed", "output": {"ok": 1}}
    succeeded = plan(d, {}, views(a="completed", fb="blocked", c="blocked"))
    assert ("fb", "primary step 'a' did not fail") in succeeded.skip


def test_max_parallel_caps_enqueued_steps():
    d = definition(*(tool(f"s{i}") for i in range(5)), max_parallel=2)
    p = plan(d, {}, views(**{f"s{i}": "blocked" for i in range(5)}))
    assert len(p.ready) == 5 and p.enqueue == ["s0", "s1"]
    later = plan(d, {}, views(s0="running", s1="completed", s2="ready", s3="ready", s4="ready"))
    assert later.enqueue == ["s2"]


def test_only_waiting_steps_means_the_run_waits():
    d = definition({"name": "g", "type": "human_gate", "approvers": "x"}, tool("b", ["g"]))
    p = plan(d, {}, views(g="waiting", b="blocked"))
    assert p.outcome == "wait"


def test_run_completes_with_the_outputs_of_its_final_steps():
    d = definition(tool("a"), tool("b", ["a"]), tool("c", ["a"]))
    p = plan(d, {}, views(a=StepView("completed", 1), b=StepView("completed", 2), c=StepView("skipped")))
    assert p.outcome == "complete" and p.detail == {"b": 2}


def test_condition_that_cannot_be_evaluated_is_reported_not_raised():
    d = definition(tool("a"), tool("b", ["a"], when="steps.a.output.missing == 1"))
    p = plan(d, {}, views(a=StepView("completed", {}), b="blocked"))
    assert [n for n, _ in p.invalid] == ["b"]
    assert p.outcome == "fail"


def test_same_state_always_gives_the_same_plan():
    d = definition(tool("a"), tool("b", ["a"]), tool("c", ["a"]))
    v = views(a=StepView("completed", {"k": 1}), b="blocked", c="blocked")
    assert plan(d, {}, v) == plan(d, {}, v)


def test_a_cycle_is_refused_with_its_steps_named_rather_than_looped_over():
    """Validation rejects cycles; the scheduler refuses one too instead of looping forever."""
    steps = [{"name": "a", "after": ["b"]}, {"name": "b", "after": ["a"]}, {"name": "c", "after": []}]
    with pytest.raises(ValueError, match=r"definition has a cycle among \['a', 'b'\]"):
        graph_of({"steps": steps})


@pytest.mark.parametrize("on_error", ["fail", "continue"])
def test_a_step_whose_fallback_failed_too_is_broken_not_pending(on_error):
    d = definition(tool("a", fallback="fb"), tool("fb"), tool("c", ["a"]), on_error=on_error)
    p = plan(d, {}, views(a="failed", fb="failed", c="blocked"))
    if on_error == "fail":
        assert (p.outcome, p.detail) == ("fail", {"class": "step_failed", "step": "a",
                                                  "message": "step 'a' ended failed"})
    else:
        assert p.skip == [("c", "upstream step 'a' did not complete")] and p.outcome == "complete"
