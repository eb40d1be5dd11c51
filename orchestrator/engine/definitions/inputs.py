"""A `human_input` step's form and answer: which JSON Schemas a form may be, and the shape of
the step's output.

A form is a JSON Schema of an object whose properties are flat fields a person can fill in one
by one (a string, possibly one of an `enum`, a number, an integer or a boolean), so the admin can
draw it as a form and the API can check an answer against it with no stand-in. `form_problems`
says, by path, why a schema is not such a form; `output_schema` is what later steps read of the
step (`steps.<name>.output`), so their templates and expressions are checked at save like any
other. Pure: no database, no rendering.
"""

from __future__ import annotations

from collections.abc import Iterator

from .problems import PathPart

# What a field of a form may be: each is drawn as one input of the form.
FIELD_TYPES = ("string", "number", "integer", "boolean")
# The keywords a field may carry: what a form can show or check one input by.
FIELD_KEYWORDS = frozenset({"type", "title", "description", "enum", "default", "minimum",
                            "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength",
                            "maxLength", "pattern", "format", "examples"})
FORM_KEYWORDS = frozenset({"type", "title", "description", "properties", "required",
                           "additionalProperties", "$schema"})
MAX_FORM_FIELDS = 50

Found = tuple[tuple[PathPart, ...], str]


def form_problems(form: object, at: tuple[PathPart, ...]) -> Iterator[Found]:
    """Why `form` (already a valid JSON Schema) cannot be drawn as a form: the path of each
    part that is not an object of flat fields, and what is wrong there."""
    if not isinstance(form, dict):
        yield at, "a form is a JSON Schema object with type: object and its fields as properties"
        return
    if form.get("type") != "object":
        yield (*at, "type"), "a form's schema must have type: object"
    for key in sorted(set(form) - FORM_KEYWORDS):
        yield (*at, key), f"{key!r} is not used by a form (allowed: {', '.join(sorted(FORM_KEYWORDS))})"
    properties = form.get("properties")
    if not isinstance(properties, dict) or not properties:
        yield (*at, "properties"), "a form needs at least one field in properties"
        return
    if len(properties) > MAX_FORM_FIELDS:
        yield (*at, "properties"), f"a form may have at most {MAX_FORM_FIELDS} fields"
    for name, field in properties.items():
        yield from _field_problems(field, (*at, "properties", name))
    required = form.get("required")
    for position, name in enumerate(required if isinstance(required, list) else []):
        if name not in properties:
            yield (*at, "required", position), f"{name!r} is required but is not a field in properties"


def _field_problems(field: object, at: tuple[PathPart, ...]) -> Iterator[Found]:
    if not isinstance(field, dict):
        yield at, "a field is a JSON Schema with a type"
        return
    kind = field.get("type")
    enum = field.get("enum")
    if kind is None and isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        kind = "string"
    if kind not in FIELD_TYPES:
        yield (*at, "type"), (f"a field's type is one of {', '.join(FIELD_TYPES)} "
                              "(a form cannot show nested objects or lists)")
    for key in sorted(set(field) - FIELD_KEYWORDS):
        yield (*at, key), f"{key!r} is not used by a form field (allowed: {', '.join(sorted(FIELD_KEYWORDS))})"


def output_schema(spec: dict) -> dict:
    """The JSON Schema of a human_input step's output: {answer, answered_by, abstained}. An
    abstention (or a deadline that abstains) answers `{}` with `abstained: true`; `abstained`
    is sampled false first, so the branch that reads the answer is the one checked at save."""
    form = spec.get("form") if isinstance(spec.get("form"), dict) else {}
    return {
        "type": "object",
        "required": ["answer", "answered_by", "abstained"],
        "properties": {
            "answer": {key: value for key, value in form.items() if key != "$schema"},
            "answered_by": {"type": ["string", "null"]},
            "abstained": {"enum": [False, True]},
        },
    }
