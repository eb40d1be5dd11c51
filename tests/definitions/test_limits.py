"""Limits on every definition input (issue 10): each refused quickly, with a path, before work starts."""

from __future__ import annotations

import tracemalloc

import pytest

from orchestrator.engine.definitions import (
    DefinitionInvalid,
    ExpressionError,
    TemplateError,
    compile_template,
    evaluate_expression,
    limits,
    parse_definition_text,
    render_template,
)
from orchestrator.engine.definitions.expressions import expression_roots
from orchestrator.engine.definitions.graph import Graph, Node

NESTED_ALL = (
    "[1,2,3,4,5,6,7,8,9,10].all(a, [1,2,3,4,5,6,7,8,9,10].all(b, "
    "[1,2,3,4,5,6,7,8,9,10].all(c, [1,2,3,4,5,6,7,8,9,10].all(d, true))))"
)
CONTEXT = {"input": {}, "steps": {}}
# The limit errors are TemplateLimitExceeded / ExpressionLimitExceeded; matched by message so
# this module also runs (and fails) on code that predates them.
TOO_COSTLY = "too large|limit|more than|not supported|too deeply|longer than|at most"


class Measured:
    """The peak traced memory of a block (with `memory=True`)."""

    def __init__(self, *, memory: bool = False) -> None:
        self.memory = memory

    def __enter__(self):
        if self.memory:
            tracemalloc.start()
        return self

    def __exit__(self, *exc_info):
        if self.memory:
            self.peak_mb = tracemalloc.get_traced_memory()[1] / 1e6
            tracemalloc.stop()


# --- templates -------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "text",
    [
        "{{ 10**10000000 }}",  # folded while compiling, on today's code: a 12 s stall
        "{{ 'a' * 300000000 }}",  # 300 MB, kept in the compiled-template cache
        "{{ 'a' | center(300000000) }}",
        "{{ 'a'.ljust(300000000) }}",
        "{{ '%0999999999d' % 1 }}",
        "{{ '{:>999999999}'.format(1) }}",
        "{{ ('a' * 1000000).join(range(100000)) }}",
        "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        "{{ range(100000) | map('string') | map('center', 1000000) | list | length }}",
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{{ [1] | batch(1000000000, 0) | list }}",
        # Amplified through many fields or shared references (issue 41): each field or item
        # is within the limit, their total is not.
        '{{ ("{0:>1000000}" * 200).format(1) }}',
        '{{ ("{x:>1000000}" * 200).format_map({"x": 1}) }}',
        '{{ ("%1000000d" * 200) % ((1,) * 200) }}',
        '{{ ("%(a)s" * 200) % {"a": "x" * 1000000} }}',
        '{{ ("%1000000d" * 200) | format(*((1,) * 200)) }}',
        '{% set s = "x" * 1000000 %}{{ [s] * 200 }}',
        '{% set s = "x" * 1000000 %}{{ ([s] * 200) ~ "" }}',
        '{% set s = "x" * 1000000 %}{{ ([s] * 200) | string | length }}',
        '{% set s = "x" * 1000000 %}{{ ([s] * 200) | tojson | length }}',
        '{% set s = "x" * 1000000 %}{{ ({"a": [s] * 200}).items() | list }}',
        '{% set s = "x" * 1000000 %}{{ "{!r}".format([s] * 200) }}',
        '{% set s = "x" * 1000000 %}{{ ([[s]] * 200) | join | length }}',
        '{% set s = "x" * 1000 %}{{ (s * 100).translate({120: s}) | length }}',
        '{{ ([[1] * 1000000] * 200) | sum(start=[]) | length }}',
        '{{ "x".encode("utf-8") * 300000000 }}',
    ],
)
def test_a_costly_template_is_refused_before_it_is_computed(text):
    # Refused by a limit (the message says which), not computed: on code without the limits
    # these render after seconds to hours, or exhaust memory. How long a refusal takes is a
    # figure for bench/, not an assertion here.
    with Measured(memory=True) as measured, pytest.raises(TemplateError, match=TOO_COSTLY):
        render_template(text, CONTEXT)

    assert measured.peak_mb < 64


def test_a_slow_render_is_stopped_by_the_render_time_budget(monkeypatch):
    monkeypatch.setattr(limits, "MAX_RENDER_SECONDS", 0.05)
    text = "{% for i in range(100000) %}{% set x = (input.s * 3) | upper %}{% endfor %}"

    with pytest.raises(TemplateError, match="longer than 0.05 s"):
        render_template(text, {"input": {"s": "ab"}})


def test_the_render_size_budget_is_what_limits_says_while_rendering(monkeypatch):
    monkeypatch.setattr(limits, "MAX_RENDER_CHARS", 1000)

    assert render_template('{{ "{0:>400}{0:>400}".format(1) | length }}', CONTEXT) == "800"
    with pytest.raises(TemplateError, match="more than 1,000 characters"):
        render_template('{{ "{0:>400}{0:>400}{0:>400}".format(1) }}', CONTEXT)


def test_formatting_that_stays_small_renders_as_python_would():
    context = {"input": {"xs": [1, "a"], "m": {"k": [1]}}, "steps": {}}
    text = ('{{ "%s-%5d-%-3s|%%|%r" % ("a", 3, input.xs, "q") }} {{ "%(k)s" % input.m }} '
            '{{ "{} {:>4} {!r} {k[0]}".format("a", 1, "b", k=[7]) }} {{ "%.2f" | format(1.5) }} '
            '{{ input.xs }} {{ input.m.items() | list }} {{ "-".join(["a", "b"]) }}')

    assert render_template(text, context) == (
        "a-    3-[1, 'a']|%|'q' [1] a    1 'b' 7 1.50 [1, 'a'] [('k', [1])] a-b")


def test_compiling_evaluates_nothing_so_the_cache_holds_no_large_value():
    with Measured(memory=True) as measured:
        compile_template("{{ 'a' * 1000000 }}{{ 'b' | center(1000000) }}{{ 7 ** 3000 }}")

    assert measured.peak_mb < 1  # the values are built (and bounded) only when rendering


def test_render_output_is_capped():
    text = "{% for i in range(2000) %}" + "x" * 1000 + "{% endfor %}"

    with pytest.raises(TemplateError, match="renders more than"):
        render_template(text, CONTEXT)


def test_a_template_source_is_capped():
    with pytest.raises(TemplateError, match=TOO_COSTLY):
        compile_template("{{ 1 }}" + "x" * limits.MAX_TEMPLATE_CHARS)


def test_deep_nesting_and_recursion_are_template_errors_not_crashes():
    for text in ("{{ " + "(" * 3000 + "1" + ")" * 3000 + " }}",
                 "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}"):
        with pytest.raises(TemplateError):
            render_template(text, CONTEXT)


def test_ordinary_templates_still_render():
    context = {"input": {"xs": ["a", "b"], "n": 3}, "steps": {}}
    text = "{{ input.xs | join(', ') }} {{ input.n * 2 }} {{ 'ab' ~ 'c' }} {{ 2 ** 10 }} {{ '%05d' % 42 }}"

    assert render_template(text, context) == "a, b 6 abc 1024 00042"


# --- expressions ---------------------------------------------------------------------------------------

def test_nested_macros_are_stopped_by_the_cost_limit():
    with pytest.raises(ExpressionError, match="evaluation steps|longer than"):
        evaluate_expression(NESTED_ALL, CONTEXT)


@pytest.mark.parametrize("evaluate", [
    lambda: evaluate_expression(
        "input.body.contains('refund') || input.body.contains('invoice') || size(input.body) > 3",
        {"input": {"body": "a refund"}}),
    lambda: render_template(
        "{% for word in input.body.split() %}{{ word | upper }} {% endfor %}",
        {"input": {"body": "a refund " * 300}}),
], ids=["expression", "template"])
def test_a_process_held_up_for_seconds_still_evaluates_an_ordinary_condition(monkeypatch, evaluate):
    """The cost limits bound a render or an evaluation; the time limit is a backstop on the
    thread's own CPU time, so a busy worker descheduled between two of its operations (here the
    wall clock jumps ten seconds) does not fail a run's condition or its parameters."""
    start = limits.time.monotonic()
    readings = iter([start])  # the budget's start; every later reading is ten seconds on
    monkeypatch.setattr(limits.time, "monotonic", lambda: next(readings, start + 10.0))
    assert evaluate()


def test_time_a_thread_waits_or_other_threads_work_is_not_charged_to_a_render():
    """Renders and evaluations are timed by their own thread's CPU time: on a machine busy
    enough to deschedule a worker for seconds, a cheap template still renders."""
    import threading
    import time

    def burn(until):
        while time.monotonic() < until:
            pass

    before = limits.spent_seconds()
    others = [threading.Thread(target=burn, args=(time.monotonic() + 0.3,)) for _ in range(2)]
    for other in others:
        other.start()
    time.sleep(0.3)
    for other in others:
        other.join()

    assert limits.spent_seconds() - before < 0.1


@pytest.mark.parametrize(
    "text",
    [
        "'a' * 100000000",
        "[" + ",".join(str(i) for i in range(40)) + "].reduce(r, i, 'ab', r + r).size()",
        "(" * 2000 + "1" + ")" * 2000,
        "1 + " * 2000 + "1",
    ],
)
def test_oversized_values_and_deep_expressions_are_refused(text):
    with pytest.raises(ExpressionError):
        evaluate_expression(text, CONTEXT)


@pytest.mark.parametrize(
    "text",
    ["(" * 1500 + "true" + ")" * 1500, "!" * 4000 + "true", "(" * 25 + "1" + ")" * 25,
     "[" * 30 + "1" + "]" * 30, "-" * 300 + "1"],
)
def test_deep_nesting_is_refused_when_compiling_so_no_walker_recurses(text):
    # expression_roots walks the tree recursively: on code without the depth limit this is a
    # RecursionError, i.e. a 500 on validate and save.
    with pytest.raises(ExpressionError, match="nests too deeply"):
        expression_roots(text)


def test_nesting_within_the_limit_compiles_and_brackets_in_strings_do_not_count():
    assert evaluate_expression("(" * 15 + "1 + 1" + ")" * 15, CONTEXT) == 2
    assert evaluate_expression("!" * 150 + "true", CONTEXT) is True
    assert evaluate_expression('"' + "(" * 100 + '" != ""', CONTEXT) is True


def test_an_expression_is_capped_in_length():
    with pytest.raises(ExpressionError, match=TOO_COSTLY):
        evaluate_expression("true || " * 1000 + "true", CONTEXT)


# --- loading ---------------------------------------------------------------------------------------------

def yaml_bomb(levels: int = 6) -> str:
    lines = ["  a: &a [x, x, x, x, x, x, x, x, x]"]
    for previous, name in zip("abcdefgh", "bcdefgh"[: levels - 1], strict=False):
        lines.append(f"  {name}: &{name} [" + ", ".join([f"*{previous}"] * 9) + "]")
    return (
        "name: bomb\ninput_schema:\n  type: object\n  x-bomb:\n" + "\n".join("  " + line for line in lines)
        + "\nsteps: [{name: s, type: tool, tool: http.get, params: {url: u}}]\n"
    )


def test_a_yaml_alias_bomb_is_refused_before_it_expands():
    with pytest.raises(DefinitionInvalid, match="aliases"):
        parse_definition_text(yaml_bomb())


@pytest.mark.parametrize(
    ("text", "content_type"),
    [
        ('{"a": ' + "[" * 10000 + "]" * 10000 + "}", "application/json"),
        ("a: " + "[" * 10000 + "]" * 10000, None),
        ('{"a": NaN}', "application/json"),
        ('{"a": 1e400}', "application/json"),
        ("a: " + "9" * 5000, None),
        ("a: '" + "x" * (limits.MAX_DEFINITION_BYTES + 1) + "'", None),
    ],
)
def test_deep_huge_or_non_finite_text_is_a_located_problem(text, content_type):
    with pytest.raises(DefinitionInvalid) as raised:
        parse_definition_text(text, content_type=content_type)

    assert [p.path for p in raised.value.problems] == [""]


# --- the document ------------------------------------------------------------------------------------------

def chain(count: int) -> dict:
    steps = [{"name": "s0", "type": "tool", "tool": "http.get", "params": {"url": "u"}}]
    steps += [{"name": f"s{i}", "type": "tool", "tool": "http.get", "params": {"url": "u"},
               "after": [f"s{i - 1}"]} for i in range(1, count)]
    return {"name": "chain", "input_schema": {"type": "object"}, "steps": steps}


def test_a_long_chain_is_refused_by_count_before_anything_else_is_checked(validate):
    problems = validate(chain(3000))

    assert [(p.path, p.message) for p in problems] == [("steps", "must have at most 500 items, not 3,000")]


def test_the_largest_allowed_chain_validates(validate):
    assert validate(chain(limits.MAX_STEPS)) == []


def test_graph_search_does_not_recurse_per_step():
    names = [f"s{i}" for i in range(5000)]
    nodes = [Node(name, (names[i - 1],) if i else ()) for i, name in enumerate(names)]

    assert Graph(nodes).cycles() == []


def test_nesting_past_the_limit_is_a_problem_with_its_path(validate, support_workflow):
    deep: object = "x"
    for _ in range(limits.MAX_DEPTH + 5):
        deep = [deep]
    support_workflow["steps"][2]["params"]["deep"] = deep

    problems = validate(support_workflow)

    assert len(problems) == 1 and problems[0].path.startswith("steps[2].params.deep")
    assert "deeper than" in problems[0].message


def test_a_definition_past_the_size_limit_is_a_problem(validate, support_workflow):
    support_workflow["description"] = "x" * limits.MAX_DEFINITION_BYTES

    assert [p.path for p in validate(support_workflow)] == [""]


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("steps", 0, "timeout_s"), 10**30),
        (("steps", 0, "timeout_s"), 1e30),
        (("budget", "max_duration_s"), 10**30),
        (("budget", "max_cost_usd"), 1e30),
        (("steps", 1, "retry", "max_attempts"), 10**9),
        (("steps", 1, "retry", "max_s"), 1e30),
        (("max_parallel",), 10**9),
    ],
)
def test_numeric_fields_have_documented_maxima(validate, support_workflow, path, value):
    node = support_workflow
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value

    problems = validate(support_workflow)

    rendered = ".".join(str(p) for p in path).replace(".0.", "[0].").replace(".1.", "[1].")
    assert [p.path for p in problems] == [rendered.replace("steps[0]", "steps[0]")]
    assert "must be <=" in problems[0].message


def test_run_input_is_bounded_in_size_and_depth():
    deep: object = 1
    for _ in range(limits.MAX_INPUT_DEPTH + 1):
        deep = {"a": deep}

    assert limits.run_input_problems({"x": "y"}) == []
    assert limits.run_input_problems({"x": "y" * limits.MAX_INPUT_BYTES})[0]["path"] == "input"
    assert "deeper than" in limits.run_input_problems(deep)[0]["message"]


# --- what saves, runs ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("prompt", "{{ 10**10000000 }}", "too costly"),
        ("prompt", "{{ 'a' * 300000000 }}", "too costly"),
        ("when", NESTED_ALL, "too costly"),
        ("prompt", "{{ steps.classify.output.categry }}", "do not have"),
        ("when", "steps.classify.output.categry == 'spam'", "do not have"),
        ("prompt", "{{ input.missing_field }}", "do not have"),
    ],
)
def test_a_template_or_expression_that_cannot_run_is_refused_at_save_time(
    validate, support_workflow, field, value, message
):
    support_workflow["steps"][1][field] = value

    problems = validate(support_workflow)

    assert [p.path for p in problems] == [f"steps[1].{field}"]
    assert message in problems[0].message


def test_reading_something_optional_needs_a_guard(validate, support_workflow):
    support_workflow["input_schema"]["properties"]["note"] = {"type": "string"}
    research = support_workflow["steps"][1]

    research["prompt"] = "{{ input.note }}"
    unguarded = validate(support_workflow)
    research["prompt"] = "{{ input.note | default('') }}{% if input.note is defined %}!{% endif %}"
    guarded = validate(support_workflow)

    assert [p.path for p in unguarded] == ["steps[1].prompt"]
    assert "may be absent" in unguarded[0].message
    assert guarded == []


def test_many_costly_expressions_share_one_bounded_allowance(validate, support_workflow):
    costly = "[1,2,3,4,5,6,7,8,9,10].all(a, [1,2,3,4,5,6,7,8,9,10].all(b, [1,2,3,4,5,6,7,8,9].all(c, true)))"
    template = support_workflow["steps"][2]
    support_workflow["steps"] += [
        {**template, "name": f"extra{i}", "when": costly} for i in range(200)
    ]

    problems = validate(support_workflow)

    # The shared allowance, not the clock, bounds the work: once it is spent, the remaining
    # expressions are refused without being evaluated.
    assert len(problems) == 200
    refused_unevaluated = [p for p in problems if "together cost more than" in p.message]
    assert len(refused_unevaluated) >= 190
