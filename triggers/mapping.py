"""How an event becomes a run input: the trigger's filter and its input template.

Pure: no database, no network. An event is described by a context of plain JSON data — for a
webhook `payload`, `headers` and `delivery`; for a queue event `payload` and `message`; for a
schedule `slot` and `slot_utc`; always `trigger` ({"name", "kind"}) — and:

* the **filter** is a CEL condition over that context (the same CEL as a step's `when`); an
  event for which it is false is ignored;
* the **input template** is a JSON value whose strings are sandboxed Jinja templates (the same
  as a step's params). A string that is exactly one `{{ expression }}` keeps the value's type
  (`"{{ payload.count }}"` gives a number); any other string renders as text. Without a
  template the payload itself is the input.

Every limit of the definitions' templates and expressions applies (size, depth, cost). What the
input must satisfy is the workflow's input schema, checked by `run_start`; this module only
builds it. Errors come back as `MappingFailed` with [{"path", "message"}] problems.
"""
from __future__ import annotations

import json
import re

from jsonschema import Draft202012Validator

from orchestrator.engine.definitions import (
    ExpressionError,
    TemplateError,
    compile_expression,
    compile_template,
    evaluate_expression,
    render_template,
)
from orchestrator.engine.definitions.limits import (
    MAX_DEPTH,
    MAX_SIGNAL_KEY_CHARS,
    MAX_TEMPLATE_CHARS,
)

# A whole string that is one output expression and nothing else.
_ONE_EXPRESSION = re.compile(r"^\s*\{\{(?P<expr>.*?)\}\}\s*$", re.DOTALL)
MAX_TEMPLATE_BYTES = 64 * 1024  # the input template as JSON text
MAX_CORRELATION_KEY_CHARS = MAX_SIGNAL_KEY_CHARS  # what a wait step's correlation key may be


class MappingFailed(Exception):
    """The filter or the template failed on an event; `problems` say where and why."""

    def __init__(self, reason_class: str, problems: list[dict]):
        super().__init__("; ".join(f"{p['path']}: {p['message']}" for p in problems))
        self.reason_class = reason_class
        self.problems = problems


def _leaves(value: object, path: str):
    """(path, string) for every string in `value`, depth-first."""
    stack = [(value, path, 1)]
    while stack:
        item, at, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise MappingFailed("template_failed", [{"path": at, "message": "nests too deeply"}])
        if isinstance(item, str):
            yield at, item
        elif isinstance(item, dict):
            stack.extend((v, f"{at}.{k}", depth + 1) for k, v in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((v, f"{at}[{i}]", depth + 1) for i, v in reversed(list(enumerate(item))))


def _whole_expression(text: str) -> str | None:
    match = _ONE_EXPRESSION.match(text)
    if not match or "{{" in match["expr"] or "}}" in match["expr"] or "{%" in text:
        return None
    return match["expr"]


def template_problems(template: object) -> list[dict]:
    """Every problem with an input template, found without rendering it."""
    if template is None:
        return []
    try:
        text = json.dumps(template)
    except (TypeError, ValueError):
        return [{"path": "input_template", "message": "must be JSON data"}]
    if len(text.encode()) > MAX_TEMPLATE_BYTES:
        return [{"path": "input_template",
                 "message": f"is larger than {MAX_TEMPLATE_BYTES:,} bytes as JSON"}]
    problems = []
    try:
        for path, leaf in _leaves(template, "input_template"):
            if len(leaf) > MAX_TEMPLATE_CHARS:
                problems.append({"path": path, "message": "template too long"})
                continue
            try:
                compile_template(_typed(leaf))
            except TemplateError as error:
                problems.append({"path": path, "message": str(error)})
    except MappingFailed as failed:
        problems.extend(failed.problems)
    return problems


def filter_problems(expression: str, *, path: str = "filter") -> list[dict]:
    """Whether the filter (or `correlate`, at `path`) compiles as CEL."""
    if not expression.strip():
        return []
    try:
        compile_expression(expression)
    except ExpressionError as error:
        return [{"path": path, "message": str(error)}]
    return []


def _typed(leaf: str) -> str:
    expression = _whole_expression(leaf)
    return "{{ (" + expression + ") | tojson }}" if expression is not None else leaf


def _render_leaf(leaf: str, context: dict, path: str) -> object:
    expression = _whole_expression(leaf)
    try:
        if expression is None:
            return render_template(leaf, context) if "{" in leaf else leaf
        try:
            return json.loads(render_template(_typed(leaf), context))
        except (TemplateError, ValueError):
            # Rendered as text, the same template says why in plain words (an undefined
            # variable, say, rather than "StrictUndefined is not JSON serializable").
            render_template(leaf, context)
            raise
    except (TemplateError, ValueError) as error:  # ValueError: tojson of a value JSON cannot hold
        message = _missing_in_words(leaf, context) or str(error)
        raise MappingFailed("template_failed", [{"path": path, "message": message}]) from None


# A dotted name in a template: `payload.ticket.id`.
_DOTTED = re.compile(r"(?<![\w.'\"])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")


def _missing_in_words(leaf: str, context: dict) -> str:
    """Why a template failed, in the words of the event it was given: the first dotted name in
    its expressions that the context does not hold ("the payload has no field 'ticket' (at
    payload.ticket)"), or "" when none is missing (the error is something else)."""
    for block in re.findall(r"\{\{(.*?)\}\}|\{%(.*?)%\}", leaf, re.DOTALL):
        # Filters and tests (`| upper`, `is defined`) and calls are not the event's names.
        code = re.sub(r"(\|\s*|\bis\s+(not\s+)?)[A-Za-z_]\w*|[A-Za-z_]\w*\s*\(", " ", "".join(block))
        code = re.sub(r"'[^']*'|\"[^\"]*\"", " ", code)  # nor what is quoted
        for name in _DOTTED.findall(code):
            root, *fields = name.split(".")
            if root not in context:
                if root in _JINJA_WORDS:
                    continue
                known = ", ".join(sorted(context))
                return f"there is no '{root}' here; a template may use {known}"
            value, at = context[root], root
            for field in fields:
                if not isinstance(value, dict):
                    return f"{at} is {_KINDS.get(type(value), 'a value')}, not an object: it has no field '{field}'"
                if field not in value:
                    owner = f"the {root}" if at == root else at
                    return f"{owner} has no field '{field}' (at {at}.{field})"
                value, at = value[field], f"{at}.{field}"
    return ""


_KINDS = {str: "a string", int: "a number", float: "a number", bool: "true or false",
          list: "a list", type(None): "null"}
# Names a template may use that are not the event's: Jinja's keywords and constants.
_JINJA_WORDS = frozenset({"and", "or", "not", "in", "is", "if", "else", "elif", "true", "false",
                          "none", "True", "False", "None", "for", "endfor", "endif", "set",
                          "loop", "with", "endwith"})


def _render(value: object, context: dict, path: str) -> object:
    if isinstance(value, str):
        return _render_leaf(value, context, path)
    if isinstance(value, dict):
        return {key: _render(item, context, f"{path}.{key}") for key, item in value.items()}
    if isinstance(value, list):
        return [_render(item, context, f"{path}[{i}]") for i, item in enumerate(value)]
    return value


def input_from_event(template: object, context: dict) -> dict:
    """The run input for an event. Raises MappingFailed("template_failed" | "invalid_input")."""
    if template is None:
        payload = context.get("payload")
        if not isinstance(payload, dict):
            raise MappingFailed("invalid_input", [{"path": "payload", "message":
                                "the payload must be a JSON object, or the trigger needs an "
                                "input_template"}])
        return payload
    template_problems_found = template_problems(template)
    if template_problems_found:
        raise MappingFailed("template_failed", template_problems_found)
    result = _render(template, context, "input_template")
    if not isinstance(result, dict):
        raise MappingFailed("invalid_input", [{"path": "input_template",
                                               "message": "must produce a JSON object"}])
    return result


class _Templated(str):
    """Stands for a template string's value, which only the event will tell."""


_COMBINED = frozenset({"anyOf", "oneOf", "allOf", "not", "if", "then", "else", "dependentSchemas"})


def _holds_templated(value: object) -> bool:
    if isinstance(value, _Templated):
        return True
    if isinstance(value, dict):
        return any(_holds_templated(item) for item in value.values())
    if isinstance(value, list):
        return any(_holds_templated(item) for item in value)
    return False


def _shape(value: object) -> object:
    if isinstance(value, str):
        return _Templated(value) if "{{" in value or "{%" in value else value
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_shape(item) for item in value]
    return value


def template_shape_problems(template: object, schema: dict) -> list[dict]:
    """What an event trigger's template is sure to get wrong, whatever the event: the input
    it builds, with each templated string standing for an unknown value, checked against the
    workflow's input `schema` — a required property it never sets, one the schema does not
    allow, a fixed value of the wrong type. Paths as "input.<property>"."""
    if not isinstance(template, dict):
        return []
    shape = _shape(template)
    problems = []
    validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    for error in sorted(validator.iter_errors(shape), key=lambda e: list(e.absolute_path)):
        if isinstance(error.instance, _Templated) or (
                error.validator in _COMBINED and _holds_templated(error.instance)):
            continue
        path = "input" + "".join(f"[{part}]" if isinstance(part, int) else f".{part}"
                                 for part in error.absolute_path)
        problems.append({"path": path, "message": error.message})
    return problems


def correlation_key(expression: str, context: dict, *, path: str = "correlate") -> str | None:
    """The key an expression (`correlate`, or `debounce_key` at `path`) gives for the event: a
    non-empty string (a number is read as its text), or None when the event names none (null,
    empty). Raises MappingFailed("<path>_failed")."""
    if not expression.strip():
        return None
    reason = "correlate_failed" if path == "correlate" else f"{path}_failed"
    try:
        result = evaluate_expression(expression, context)
    except ExpressionError as error:
        raise MappingFailed(reason, [{"path": path, "message": str(error)}]) from None
    if result is None or result == "":
        return None
    if isinstance(result, bool) or not isinstance(result, str | int):
        raise MappingFailed(reason, [{"path": path, "message":
                            f"must give a string (or null), not {type(result).__name__}"}])
    key = str(result)
    if len(key) > MAX_CORRELATION_KEY_CHARS:
        raise MappingFailed(reason, [{"path": path, "message":
                            f"gave {len(key)} characters; a key has at most "
                            f"{MAX_CORRELATION_KEY_CHARS}"}])
    return key


def event_matches(expression: str, context: dict) -> bool:
    """Whether the filter holds for the event. Raises MappingFailed("filter_failed")."""
    if not expression.strip():
        return True
    try:
        result = evaluate_expression(expression, context)
    except ExpressionError as error:
        raise MappingFailed("filter_failed", [{"path": "filter", "message": str(error)}]) from None
    if not isinstance(result, bool):
        raise MappingFailed("filter_failed", [{"path": "filter", "message":
                            f"must be true or false, not {type(result).__name__}"}])
    return result
