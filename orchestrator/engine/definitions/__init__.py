"""Workflow definitions: the format, parsing, validation, normalization, expressions, templates.

The public API the rest of Stepwise uses; import from here, not from the modules:

* `parse_definition_text` (loader.py) - YAML/JSON text to a dict.
* `definition_format_schema`, `calls_model` (format.py) - the JSON Schema of the format; whether
  a step asks a model.
* `validate_definition` (validation.py) - every problem, each with its path.
* `normalize_definition` (normalize.py) - a valid definition with defaults filled in.
* `compile_expression`, `evaluate_expression`, `expression_roots`, `referenced_steps`
  (expressions.py) - CEL.
* `compile_template`, `render_template`, `render_value`, `contains_template` (templates.py) -
  sandboxed Jinja2.
* `schema_accepts` (compat.py) - whether one step's output satisfies another's input.
* `parse_time`, `TimeInvalid` (times.py) - a sleep step's `until`, read in its time zone.
"""

from .compat import schema_accepts
from .expressions import (
    ExpressionError,
    compile_expression,
    evaluate_expression,
    expression_roots,
    referenced_steps,
)
from .format import calls_model, definition_format_schema
from .loader import parse_definition_text
from .normalize import normalize_definition
from .problems import DefinitionInvalid, Problem
from .templates import (
    TemplateError,
    compile_template,
    contains_template,
    render_template,
    render_value,
)
from .times import TimeInvalid, parse_time
from .validation import validate_definition

__all__ = [
    "DefinitionInvalid",
    "ExpressionError",
    "Problem",
    "TemplateError",
    "TimeInvalid",
    "calls_model",
    "compile_expression",
    "compile_template",
    "contains_template",
    "definition_format_schema",
    "evaluate_expression",
    "expression_roots",
    "normalize_definition",
    "parse_definition_text",
    "parse_time",
    "referenced_steps",
    "render_template",
    "render_value",
    "schema_accepts",
    "validate_definition",
]
