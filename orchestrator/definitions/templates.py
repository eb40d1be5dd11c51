"""Templates: compiling and rendering prompt, parameter and input strings.

Owns every use of Jinja2 in definitions. Templates render in Jinja's immutable sandbox
with `StrictUndefined`, so a template can read its context but never call methods that
mutate it, reach Python internals (`''.__class__`), or silently print an empty string for
a missing variable. Autoescaping is off: outputs are prompts and JSON values, not HTML.
It must not decide which variables a step may use; `validation.py` does that with
`template_names` and `template_step_references`.
"""

from __future__ import annotations

from functools import lru_cache

import jinja2
from jinja2 import StrictUndefined, meta, nodes
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

_environment = ImmutableSandboxedEnvironment(undefined=StrictUndefined, autoescape=False)

_MARKERS = ("{{", "{%", "{#")


class TemplateError(Exception):
    """A template does not compile, or failed while rendering (missing variable, unsafe access)."""


@lru_cache(maxsize=4096)
def compile_template(text: str) -> jinja2.Template:
    """Compile `text`. Raises TemplateError with Jinja's message and line."""
    if not isinstance(text, str):
        raise TemplateError(f"a template must be a string, not {type(text).__name__}")
    try:
        return _environment.from_string(text)
    except jinja2.TemplateSyntaxError as error:
        raise TemplateError(
            f"template syntax error on line {error.lineno}: {error.message}"
        ) from None


def render_template(text: str, context: dict) -> str:
    """Render `text` with `context`. Raises TemplateError on any failure."""
    template = compile_template(text)
    try:
        return template.render(context)
    except jinja2.UndefinedError as error:
        raise TemplateError(f"undefined variable: {error.message}") from None
    except SecurityError as error:
        raise TemplateError(f"unsafe template: {error}") from None
    except (jinja2.TemplateError, ArithmeticError, LookupError, TypeError, ValueError) as error:
        raise TemplateError(f"template failed: {error}") from None


def render_value(value: object, context: dict) -> object:
    """Render every string inside `value` (dicts and lists, recursively) as a template.

    Keys are not rendered; non-string leaves are returned unchanged. Raises TemplateError.
    """
    if isinstance(value, str):
        return render_template(value, context) if is_template(value) else value
    if isinstance(value, dict):
        return {key: render_value(item, context) for key, item in value.items()}
    if isinstance(value, list):
        return [render_value(item, context) for item in value]
    return value


def is_template(text: str) -> bool:
    """True when `text` contains Jinja markup; plain strings render as themselves."""
    return any(marker in text for marker in _MARKERS)


def contains_template(value: object) -> bool:
    if isinstance(value, str):
        return is_template(value)
    if isinstance(value, dict):
        return any(contains_template(item) for item in value.values())
    if isinstance(value, list):
        return any(contains_template(item) for item in value)
    return False


def template_names(text: str) -> set[str]:
    """Free variables `text` reads (Jinja globals such as `range` excluded).

    Raises TemplateError if `text` does not compile.
    """
    return set(meta.find_undeclared_variables(_parse(text)))


def template_step_references(text: str) -> set[str]:
    """Names X of every ``steps.X`` / ``steps['X']`` in `text`. Raises TemplateError."""
    tree = _parse(text)
    found = set()
    for node in tree.find_all((nodes.Getattr, nodes.Getitem)):
        if not (isinstance(node.node, nodes.Name) and node.node.name == "steps"):
            continue
        if isinstance(node, nodes.Getattr):
            found.add(node.attr)
        elif isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str):
            found.add(node.arg.value)
    return found


@lru_cache(maxsize=4096)
def _parse(text: str) -> nodes.Template:
    compile_template(text)  # raises TemplateError with a readable message
    return _environment.parse(text)
