"""CEL expressions: evaluation to plain Python, errors, and what an expression reads."""

from __future__ import annotations

import re

import pytest

from orchestrator.engine.definitions import (
    ExpressionError,
    compile_expression,
    evaluate_expression,
    expression_roots,
    referenced_steps,
)

CONTEXT = {
    "input": {"body": "please refund", "amount": 12, "tags": ["a", "b"]},
    "steps": {"classify": {"output": {"category": "billing", "score": 0.9}, "state": "completed"}},
}


@pytest.mark.parametrize(
    ("text", "expected", "kind"),
    [
        ("steps.classify.output.category == 'billing'", True, bool),
        ("input.amount * 2", 24, int),
        ("steps.classify.output.score / 3.0", 0.3, float),
        ("input.body + '!'", "please refund!", str),
        ("input.tags.map(t, t + t)", ["aa", "bb"], list),
        ("{'n': input.amount, 'ok': true}", {"n": 12, "ok": True}, dict),
        ("null", None, type(None)),
        ("1u + 2u", 3, int),
        ("input.tags.exists(t, t == 'b')", True, bool),
        ("duration('90s')", 90.0, float),
        ("timestamp('2024-01-02T03:04:05Z')", "2024-01-02T03:04:05+00:00", str),
    ],
)
def test_evaluation_returns_plain_python(text, expected, kind):
    result = evaluate_expression(text, CONTEXT)
    assert result == pytest.approx(expected) if kind is float else result == expected
    assert type(result) is kind


def test_nested_results_contain_only_plain_types():
    result = evaluate_expression("[input, steps.classify]", CONTEXT)

    def types(value):
        if isinstance(value, dict):
            return (
                {type(value)}
                | {t for v in value.values() for t in types(v)}
                | {type(k) for k in value}
            )
        if isinstance(value, list):
            return {type(value)} | {t for v in value for t in types(v)}
        return {type(value)}

    assert types(result) <= {dict, list, str, int, float, bool, type(None)}
    assert result[1]["output"]["category"] == "billing"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("input.missing", "no such member in mapping: 'missing'"),
        ("steps.research.output", "'research'"),
        ("input.body + 1", "no matching overload for '+'"),
        ("input.amount / 0", "divide by zero"),
        ("nothing", "undeclared reference to 'nothing'"),
    ],
)
def test_evaluation_errors_raise_expression_error(text, message):
    with pytest.raises(ExpressionError, match=re.escape(message)):
        evaluate_expression(text, CONTEXT)


@pytest.mark.parametrize("text", ["a +", "steps.", "(", "", "   ", "input.x ? 1"])
def test_syntax_errors_raise_expression_error(text):
    with pytest.raises(ExpressionError):
        compile_expression(text)


def test_compiled_programs_are_cached():
    assert compile_expression("input.amount > 1") is compile_expression("input.amount > 1")


def test_non_json_context_raises_expression_error():
    with pytest.raises(ExpressionError, match="JSON-like"):
        evaluate_expression("input", {"input": object()})


@pytest.mark.parametrize(
    ("text", "roots", "steps"),
    [
        (
            "steps.classify.output.category != 'spam' && input.x > 1",
            {"steps", "input"},
            {"classify"},
        ),
        ("steps['fetch'].output.size() > 0", {"steps"}, {"fetch"}),
        ("has(steps.a.output.x) || steps.b.state == 'skipped'", {"steps"}, {"a", "b"}),
        ("input.items.exists(x, x > steps.c.output)", {"input", "steps"}, {"c"}),
        ("input.items.map(steps, steps.d)", {"input"}, set()),  # `steps` bound by the macro
        ("item.name + string(index)", {"item", "index"}, set()),
        ("type(input) == map", {"input"}, set()),
        ("'steps.fake' == input.s", {"input"}, set()),  # inside a string literal
        ("size(steps) > 0", {"steps"}, set()),
        ("ticket.body", {"ticket"}, set()),
    ],
)
def test_roots_and_referenced_steps(text, roots, steps):
    assert expression_roots(text) == roots
    assert referenced_steps(text) == steps


def test_static_helpers_raise_on_syntax_errors():
    with pytest.raises(ExpressionError):
        expression_roots("a +")
    with pytest.raises(ExpressionError):
        referenced_steps("a +")
