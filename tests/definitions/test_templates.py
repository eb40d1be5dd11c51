"""Sandboxed Jinja2 templates: rendering, strict undefined, and the sandbox."""

from __future__ import annotations

import pytest

from orchestrator.engine.definitions import (
    TemplateError,
    compile_template,
    render_template,
    render_value,
)

CONTEXT = {
    "input": {"name": "Ada", "tags": ["x", "y"]},
    "steps": {"draft": {"output": {"subject": "Hi", "items": [1, 2]}, "state": "completed"}},
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Hello {{ input.name }}", "Hello Ada"),
        ("{{ steps.draft.output.subject }}!", "Hi!"),
        ("{{ input.tags | join(',') }}", "x,y"),
        ("{% for t in input.tags %}[{{ loop.index }}{{ t }}]{% endfor %}", "[1x][2y]"),
        ("{{ steps.draft.output['items'] | length }}", "2"),
        ("<b>{{ input.name }}</b> & {{ '<i>' }}", "<b>Ada</b> & <i>"),  # no autoescape
        ("plain text", "plain text"),
    ],
)
def test_templates_render(text, expected):
    assert render_template(text, CONTEXT) == expected


@pytest.mark.parametrize(
    "text",
    ["{{ missing }}", "{{ input.missing }}", "{{ steps.research.output }}"],
)
def test_missing_variables_raise_template_error(text):
    with pytest.raises(TemplateError, match="undefined"):
        render_template(text, CONTEXT)


@pytest.mark.parametrize(
    "text",
    [
        "{{ ''.__class__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ input.tags.append('z') }}",
        "{{ input.update({'name': 'Eve'}) }}",
        "{{ cycler.__init__.__globals__ }}",
    ],
)
def test_sandbox_blocks_unsafe_access(text):
    context = {"input": {"name": "Ada", "tags": ["x"]}, "steps": {}}
    with pytest.raises(TemplateError):
        render_template(text, context)
    assert context["input"] == {"name": "Ada", "tags": ["x"]}


@pytest.mark.parametrize(
    "text", ["{{ input.name ", "{% if %}", "{% for x in %}{% endfor %}", "{{ }}"]
)
def test_syntax_errors_raise_template_error(text):
    with pytest.raises(TemplateError, match="syntax error"):
        compile_template(text)


def test_render_value_renders_every_nested_string_and_keeps_the_rest():
    value = {
        "to": "{{ input.name }}",
        "count": 3,
        "flags": [True, None, "{{ steps.draft.output.subject }}"],
        "nested": {"{{ key }}": "{{ input.tags[0] }}"},
    }

    assert render_value(value, CONTEXT) == {
        "to": "Ada",
        "count": 3,
        "flags": [True, None, "Hi"],
        "nested": {"{{ key }}": "x"},  # keys are not templates
    }
    assert value["to"] == "{{ input.name }}"  # the input is not mutated


def test_compiled_templates_are_cached():
    assert compile_template("{{ input.name }}") is compile_template("{{ input.name }}")


def test_runtime_errors_raise_template_error():
    with pytest.raises(TemplateError):
        render_template("{{ input.name / 0 }}", CONTEXT)
