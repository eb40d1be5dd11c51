"""The scheduler is a pure function: each branch is checked without a database or worker."""
import re

import pytest

from orchestrator.engine.definitions import normalize_definition
from orchestrator.engine.scheduler import (
    StepView,
    current_iteration,
    graph_of,
    iteration_name,
    plan,
)


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


def test_a_step_that_must_wait_does_not_hold_up_the_steps_after_it():
    d = definition(tool("a"), tool("x"), tool("b", ["a"]), tool("y", ["x"]))
    assert graph_of(d).order == ("a", "x", "b", "y")
    p = plan(d, {}, views(a="running", x="completed", b="blocked", y="blocked"))
    assert [n for n, _ in p.ready] == ["y"] and p.enqueue == ["y"]


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
    assert p.skip == [("c", "no upstream step completed")]


def test_router_skips_branches_not_chosen():
    router = {"name": "r", "type": "router", "routes": [
        {"name": "yes", "when": "input.x > 1", "then": ["y"]}], "default": {"name": "no", "then": ["n"]}}
    d = definition(router, tool("y", ["r"]), tool("n", ["r"]))
    p = plan(d, {}, views(r=StepView("completed", {"route": "no"}), y="blocked", n="blocked"))
    assert p.skip == [("y", "not on route 'no' chosen by 'r'")]
    assert [n for n, _ in p.ready] == ["n"]


def router(name, yes, no):
    return {"name": name, "type": "router", "routes": [{"name": "yes", "when": "input.x > 1", "then": yes}],
            "default": {"name": "no", "then": no}}


@pytest.mark.parametrize("after, routers", [
    (["a", "r"], {"r": "no"}),  # a dependency that is no router comes first
    (["r0", "r"], {"r0": "yes", "r": "no"}),  # a router that does not target the step comes first
])
def test_every_router_a_step_depends_on_is_asked_about_its_route(after, routers):
    d = definition(tool("a"), router("r0", ["other"], ["other"]), router("r", ["c"], ["n"]),
                   tool("other", ["r0"]), tool("n", ["r"]), tool("c", after))
    states = {"a": "completed", "other": "blocked", "n": "blocked", "c": "blocked", "r0": "completed",
              **{r: StepView("completed", {"route": route}) for r, route in routers.items()}}
    p = plan(d, {}, views(**states))
    assert ("c", "not on route 'no' chosen by 'r'") in p.skip
    assert "c" not in [n for n, _ in p.ready]


@pytest.mark.parametrize("on_error, outcome", [("fail", "fail"), ("pause", "pause"), ("continue", "complete")])
def test_a_failed_step_applies_the_workflow_error_policy(on_error, outcome):
    d = definition(tool("a"), tool("b", ["a"]), on_error=on_error)
    p = plan(d, {}, views(a="failed", b="blocked"))
    assert p.outcome == outcome
    if on_error == "continue":
        assert [n for n, _ in p.skip] == ["b"]
    else:
        assert p.skip == [] and p.ready == []


@pytest.mark.parametrize("on_error, state, message", [
    ("fail", "failed", "step 'b' ended failed"),
    ("fail", "timed_out", "step 'b' ended timed_out"),
    ("pause", "failed", "step 'b' ended failed; run paused for an operator"),
    ("pause", "cancelled", "step 'b' ended cancelled; run paused for an operator"),
])
def test_a_run_stopped_by_broken_steps_names_the_first_one_and_its_state(on_error, state, message):
    d = definition(tool("a"), tool("b"), tool("c"), tool("d", ["b"]), on_error=on_error)
    p = plan(d, {}, views(a="completed", b=state, c="failed", d="blocked"))
    assert (p.outcome, p.detail) == (on_error, {"class": "step_failed", "message": message, "step": "b"})


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


def test_a_fallback_listed_before_its_primary_is_skipped_in_the_same_plan_as_its_primary():
    d = definition(tool("fb"), tool("a", when="false == true", fallback="fb"), tool("c", ["a"]))
    p = plan(d, {}, views(fb="blocked", a="blocked", c="blocked"))
    assert p.skip == [("a", "condition is false: false == true"),
                      ("c", "upstream step 'a' did not complete"),
                      ("fb", "primary step 'a' did not fail")]
    assert (p.outcome, p.detail) == ("complete", {})


@pytest.mark.parametrize("when, fallback", [
    ("false == true", ("skip", "primary step 'a' did not fail")),  # the primary is skipped
    ("input.missing == 1", ("ready", None)),  # its condition cannot be evaluated: it failed
])
def test_a_fallback_listed_before_its_primary_follows_the_primary_decided_by_its_condition(when, fallback):
    """The only decision of the first look is the primary's own, by its condition: the
    fallback, looked at before it, is decided on a second look in the same plan."""
    d = definition(tool("fb"), tool("a", when=when, fallback="fb"))
    p = plan(d, {}, views(fb="blocked", a="blocked"))
    verdict, reason = fallback
    if verdict == "skip":
        assert ("fb", reason) in p.skip and p.outcome == "complete"
    else:
        assert [n for n, _ in p.ready] == ["fb"] and p.enqueue == ["fb"] and p.outcome == "resume"


def test_a_step_after_a_failed_primary_is_decided_once_its_fallback_listed_after_it_is():
    d = definition(tool("x"), tool("a", fallback="fb"), tool("c", ["a"]), tool("fb", ["x"]),
                   on_error="continue")
    p = plan(d, {}, views(x="failed", a="failed", c="blocked", fb="blocked"))
    assert p.skip == [("fb", "upstream step 'x' did not complete"),
                      ("c", "upstream step 'a' did not complete")]
    assert p.outcome == "complete"


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


@pytest.mark.parametrize("ended", [
    ["skipped"],
    ["skipped", "failed"],
    ["skipped", "failed", "timed_out", "cancelled"],  # every terminal state at once
])
def test_a_run_under_on_error_continue_completes_whichever_terminal_states_its_steps_ended_in(ended):
    others = {f"s{i}": state for i, state in enumerate(ended)}
    d = definition(tool("a"), *(tool(n) for n in others), on_error="continue")
    p = plan(d, {}, views(a=StepView("completed", 1), **others))
    assert (p.outcome, p.detail) == ("complete", {"a": 1})


@pytest.mark.parametrize("steps, on_error", [
    ([tool("a", fallback="fb"), tool("fb", ["a"]), tool("c", ["a"])], "fail"),  # fb waits on its primary
    ([tool("a", fallback="fb"), tool("fb", ["a"]), tool("c", ["a"])], "continue"),
    ([tool("a", fallback="fb"), tool("b", ["a"]), tool("fb", ["b"])], "fail"),  # on a step after its primary
])
def test_a_run_in_which_no_step_can_make_progress_fails_as_a_deadlock(steps, on_error):
    """The guard for a state nothing moves forward: a failed step counts as pending while its
    fallback has not finished, and here the fallback waits for that very step."""
    p = plan(definition(*steps, on_error=on_error), {}, views(a="failed", **{s["name"]: "blocked" for s in steps[1:]}))
    assert (p.ready, p.skip, p.invalid, p.enqueue) == ([], [], [], [])
    assert (p.outcome, p.detail) == ("fail", {"class": "deadlock", "message": "no step can make progress"})


def test_condition_that_cannot_be_evaluated_is_reported_not_raised():
    d = definition(tool("a"), tool("b", ["a"], when="steps.a.output.missing == 1"))
    p = plan(d, {}, views(a=StepView("completed", {}), b="blocked"))
    assert p.invalid == [("b", "condition could not be evaluated: no such member in mapping: 'missing'")]
    assert (p.outcome, p.detail) == ("fail", {"class": "step_failed", "message": "step 'b' ended failed",
                                              "step": "b"})


def test_a_step_after_one_with_an_invalid_condition_is_still_planned():
    d = definition(tool("a"), tool("b", ["a"], when="steps.a.output.missing == 1"), tool("c", ["a"]),
                   on_error="continue")
    p = plan(d, {}, views(a=StepView("completed", {}), b="blocked", c="blocked"))
    assert [n for n, _ in p.invalid] == ["b"] and [n for n, _ in p.ready] == ["c"]


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


# --- loops: an iteration planned like a small workflow, and the loop's verdict ----------------


def loop(max_iterations=3, **extra):
    return {
        "name": "refine", "type": "loop", "max_iterations": max_iterations,
        "input": {"topic": "{{ input.topic }}"},
        "until": "steps.critique.output.approved == true",
        "body": [tool("draft"), tool("critique", ["draft"])],
        **extra,
    }


def looped(*extra_steps, max_parallel=10, **loop_extra):
    return definition(tool("a"), loop(after=["a"], **loop_extra), tool("publish", ["refine"]), *extra_steps,
                      max_parallel=max_parallel)


def iteration(number, *, draft="blocked", critique="blocked", **earlier):
    """Step views of a waiting loop in iteration `number`: the earlier iterations finished
    (not approved) unless `earlier` says otherwise."""
    before = {}
    for i in range(1, number):
        before.update({f"draft[{i}]": done({"n": i}), f"critique[{i}]": done({"approved": False})})
    before.update({n: (v if isinstance(v, StepView) else StepView(v)) for n, v in earlier.items()})
    return {"a": StepView("completed", {"k": 1}), "refine": StepView("waiting"), "publish": StepView("blocked"),
            **before,
            f"draft[{number}]": draft if isinstance(draft, StepView) else StepView(draft),
            f"critique[{number}]": critique if isinstance(critique, StepView) else StepView(critique)}


def done(output):
    return StepView("completed", output)


def test_an_iteration_step_run_resolves_to_its_body_step_spec_and_nothing_else_does():
    graph = graph_of(looped())
    assert graph.bodies["refine"].order == ("draft", "critique")
    assert graph.steps["draft[2]"] is graph.steps["draft"]
    assert graph.steps["critique[10]"]["after"] == ["draft"]
    for unknown in ("nothing", "nothing[1]", "[1]"):
        with pytest.raises(KeyError, match=re.escape(repr(unknown))):
            graph.steps[unknown]
    assert iteration_name("draft", 3) == "draft[3]"


@pytest.mark.parametrize("present, number", [
    ([], 0),
    (["draft[1]"], 1),
    (["draft[1]", "draft[2]", "draft[3]"], 3),
    (["draft[1]", "draft[3]"], 1),  # only an unbroken run from 1 counts
    (["critique[1]"], 0),  # the body's first step tells
])
def test_the_current_iteration_is_the_newest_one_whose_first_body_step_exists(present, number):
    body = graph_of(looped()).bodies["refine"]
    assert current_iteration(body, dict.fromkeys(present, StepView("blocked"))) == number


def test_a_waiting_loop_without_step_runs_plans_nothing_for_its_body():
    views_ = {"a": done({}), "refine": StepView("waiting"), "publish": StepView("blocked")}
    p = plan(looped(), {}, views_)
    assert (p.ready, p.skip, p.invalid, p.enqueue, p.loops, p.outcome) == ([], [], [], [], [], "wait")


def test_the_first_iteration_reads_its_number_and_the_loop_input_and_no_previous_iteration():
    p = plan(looped(), {"topic": "tides"}, iteration(1))
    context = {"number": 1, "input": {"topic": "tides"}, "previous": {}}
    assert p.ready == [("draft[1]", {"input": {"topic": "tides"}, "steps": {}, "iteration": context})]
    assert p.enqueue == ["draft[1]"] and p.skip == [] and p.loops == [] and p.outcome == "resume"


def test_a_later_iteration_reads_every_body_step_of_the_one_before():
    views_ = iteration(3, **{"draft[1]": done({"text": "one"}), "critique[1]": done({"approved": False}),
                             "draft[2]": done({"text": "two"}), "critique[2]": StepView("failed")})
    [(name, inp)] = plan(looped(), {"topic": "tides"}, views_).ready
    assert name == "draft[3]"
    assert inp["iteration"] == {"number": 3, "input": {"topic": "tides"}, "previous": {
        "draft": {"state": "completed", "output": {"text": "two"}},
        "critique": {"state": "failed", "output": None}}}


def test_an_iteration_step_reads_the_earlier_body_steps_of_its_own_iteration():
    views_ = iteration(2, draft=done({"text": "two"}), **{"draft[1]": done({"text": "one"}),
                                                          "critique[1]": done({"approved": False})})
    [(name, inp)] = plan(looped(), {"topic": "tides"}, views_).ready
    assert name == "critique[2]"
    assert inp["steps"] == {"draft": {"state": "completed", "output": {"text": "two"}}}
    assert inp["iteration"]["number"] == 2


def test_iteration_steps_share_the_run_max_parallel_in_definition_order():
    d = looped(tool("side", ["a"]), max_parallel=1)
    views_ = {**iteration(1), "side": StepView("blocked")}
    p = plan(d, {"topic": "t"}, views_)
    assert [n for n, _ in p.ready] == ["side", "draft[1]"]
    assert p.enqueue == ["draft[1]"]  # the loop's iteration comes right after the loop step
    busy = plan(d, {"topic": "t"}, {**iteration(1, draft="running"), "side": StepView("blocked")})
    assert busy.enqueue == []


@pytest.mark.parametrize("max_iterations, number, approved, verdict", [
    (3, 1, True, ("complete", {"iterations": 1, "last": {"draft": {"n": 1}, "critique": {"approved": True}}})),
    (3, 3, True, ("complete", {"iterations": 3, "last": {"draft": {"n": 3}, "critique": {"approved": True}}})),
    (3, 1, False, ("next", {"iteration": 2})),
    (3, 2, False, ("next", {"iteration": 3})),
    (3, 3, False, ("fail", {"class": "loop_exhausted", "iterations": 3,
                            "message": "until did not hold after 3 iterations (max_iterations)"})),
    (1, 1, False, ("fail", {"class": "loop_exhausted", "iterations": 1,
                            "message": "until did not hold after 1 iterations (max_iterations)"})),
    (3, 1, "yes", ("next", {"iteration": 2})),  # only true itself holds
])
def test_a_finished_iteration_decides_the_loop(max_iterations, number, approved, verdict):
    views_ = iteration(number, draft=done({"n": number}), critique=done({"approved": approved}))
    p = plan(looped(max_iterations=max_iterations), {"topic": "t"}, views_)
    assert p.loops == [("refine", *verdict)]
    assert p.ready == [] and p.skip == [] and p.enqueue == [] and p.outcome == "wait"


def test_until_reads_the_run_input_the_body_steps_and_the_iteration():
    until = ("input.go == true && steps.critique.state == 'completed' && iteration.number == 2"
             " && iteration.input.topic == 't' && iteration.previous.draft.output.n == 1")
    views_ = iteration(2, draft=done({"n": 2}), critique=done({}),
                       **{"draft[1]": done({"n": 1}), "critique[1]": done({})})
    p = plan(looped(until=until), {"topic": "t", "go": True}, views_)
    assert p.loops == [("refine", "complete", {"iterations": 2, "last": {"draft": {"n": 2}, "critique": {}}})]


def test_the_loop_output_keeps_only_the_completed_body_steps():
    d = definition(loop(body=[tool("draft"), tool("critique", ["draft"]),
                              tool("extra", ["draft"], when="false == true")],
                        until="steps.draft.output.n == 1"))
    views_ = {"refine": StepView("waiting"), "draft[1]": done({"n": 1}), "critique[1]": done({"c": 1}),
              "extra[1]": StepView("skipped")}
    p = plan(d, {"topic": "t"}, views_)
    assert p.loops == [("refine", "complete", {"iterations": 1, "last": {"draft": {"n": 1}, "critique": {"c": 1}}})]


@pytest.mark.parametrize("extra", ["blocked", "skipped"])  # skipped in this very plan, or before
def test_until_reads_the_state_of_a_skipped_body_step(extra):
    d = definition(loop(body=[tool("draft"), tool("extra", ["draft"], when="false == true")],
                        until="steps.extra.state == 'skipped'"))
    views_ = {"refine": StepView("waiting"), "draft[1]": done({"n": 1}), "extra[1]": StepView(extra)}
    p = plan(d, {"topic": "t"}, views_)
    assert p.skip == ([("extra[1]", "condition is false: false == true")] if extra == "blocked" else [])
    assert p.loops == [("refine", "complete", {"iterations": 1, "last": {"draft": {"n": 1}}})]


def test_an_until_that_cannot_be_evaluated_fails_the_loop_with_its_reason():
    views_ = iteration(2, draft=done({}), critique=done({}),
                       **{"draft[1]": done({}), "critique[1]": done({"approved": False})})
    p = plan(looped(), {"topic": "t"}, views_)
    assert p.loops == [("refine", "fail", {
        "class": "validation", "iteration": 2,
        "message": "until could not be evaluated: no such member in mapping: 'approved'"})]


def test_a_failed_body_step_fails_the_loop_at_once_naming_its_iteration_step():
    p = plan(looped(), {"topic": "t"}, iteration(2, draft="failed"))
    assert p.loops == [("refine", "fail", {
        "class": "iteration_failed", "iteration": 2, "step": "draft[2]",
        "message": "iteration 2: step 'draft' ended failed"})]
    assert p.skip == [] and p.ready == [] and p.outcome == "wait"


def test_skipped_and_invalid_body_steps_are_reported_under_their_iteration_names():
    body = [tool("draft"), tool("critique", ["draft"], when="false == true"),
            tool("check", ["draft"], when="steps.draft.output.nothing == 1")]
    d = definition(loop(body=body, until="true == true"))
    views_ = {"refine": StepView("waiting"), "draft[4]": done({}), "critique[4]": StepView("blocked"),
              "check[4]": StepView("blocked"), **{f"{b}[{i}]": done({}) for b in ("draft", "critique", "check")
                                                   for i in (1, 2, 3)}}
    p = plan(d, {"topic": "t"}, views_)
    assert p.skip == [("critique[4]", "condition is false: false == true")]
    assert p.invalid == [("check[4]", "condition could not be evaluated: no such member in mapping: 'nothing'")]
    assert p.ready == [] and p.enqueue == []
    # the invalid step counts as failed: the iteration fails on it
    assert p.loops == [("refine", "fail", {
        "class": "iteration_failed", "iteration": 4, "step": "check[4]",
        "message": "iteration 4: step 'check' ended failed"})]


def test_a_loop_input_that_cannot_be_rendered_fails_the_loop_and_plans_no_body_step():
    d = looped(input={"topic": "{{ steps.a.output.missing }}"})
    p = plan(d, {"topic": "t"}, iteration(1))
    assert p.loops == [("refine", "fail", {
        "class": "validation",
        "message": "loop input: undefined variable: 'dict object' has no attribute 'missing'"})]
    assert p.ready == [] and p.enqueue == [] and p.outcome == "wait"


def test_the_loop_input_is_rendered_from_the_loop_upstream_steps():
    d = looped(input={"k": "{{ steps.a.output.k }}", "topic": "{{ input.topic }}"})
    [(_, inp)] = plan(d, {"topic": "t"}, iteration(1)).ready
    assert inp["iteration"]["input"] == {"k": "1", "topic": "t"}
