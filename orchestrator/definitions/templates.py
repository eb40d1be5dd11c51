"""Templates: compiling and rendering prompt, parameter and input strings.

Owns every use of Jinja2 in definitions. Templates render in Jinja's immutable sandbox
with `StrictUndefined`, so a template can read its context but never call methods that
mutate it, reach Python internals (`''.__class__`), or silently print an empty string for
a missing variable. Autoescaping is off: outputs are prompts and JSON values, not HTML.

Two rules on top of Jinja's sandbox:

* **Data first.** `steps.X`, `input.X`, `item.X` and every other dotted read of a mapping
  return the mapping's entry X whenever it has one, so a step called `items` or an input
  field called `update` reads the data, never a method of `dict`. Methods of a mapping
  (`input.items()`) stay reachable only under names the data does not use.
* **Bounded cost.** Nothing is evaluated while compiling (no constant folding: the
  optimizer is off, output folding is disabled by a context-bound `finalize`, and every
  arithmetic operator is intercepted), and one render is bounded in the size of any value
  it builds, the total it builds, what it outputs and the loop iterations it runs
  (`limits.py`). A render past a limit fails with `TemplateLimitExceeded`; the compiled
  template cache is bounded in entries and each entry by the template's source size.

It must not decide which variables a step may use; `validation.py` does that with
`template_names`, `template_step_references` and `template_render_problem`.
"""

from __future__ import annotations

import contextvars
import functools
import re
import string
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache

import jinja2
from jinja2 import StrictUndefined, meta, nodes, pass_context
from jinja2.compiler import CodeGenerator
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from . import limits

_MARKERS = ("{{", "{%", "{#")


class TemplateError(Exception):
    """A template does not compile, or failed while rendering (missing variable, unsafe access)."""


class TemplateLimitExceeded(TemplateError):
    """A template is too large, or rendering it would exceed a size or cost limit."""


class TemplateUndefined(TemplateError):
    """A template read a variable, attribute or item that its context does not have."""


class TemplateUnsafe(TemplateError):
    """A template reached for something the sandbox refuses."""


# --- the per-render budget --------------------------------------------------------------------


class _Budget:
    """What one render may still spend: characters built in total and loop iterations."""

    def __init__(self) -> None:
        self.chars_left = limits.MAX_RENDER_CHARS * 8
        self.steps_left = limits.MAX_RENDER_STEPS

    def charge(self, size: int, what: str) -> None:
        if size > limits.MAX_RENDER_CHARS:
            raise TemplateLimitExceeded(
                f"{what} would be {size:,} long; the limit is {limits.MAX_RENDER_CHARS:,}"
            )
        self.chars_left -= size
        if self.chars_left < 0:
            raise TemplateLimitExceeded(
                f"the template builds more than {limits.MAX_RENDER_CHARS * 8:,} characters "
                "of values in total"
            )


_budget: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar(
    "template_budget", default=None
)


def _charge(size: int, what: str) -> None:
    budget = _budget.get()
    if budget is None:  # outside a render (e.g. a filter folded while compiling): refuse big
        if size > limits.MAX_RENDER_CHARS:
            raise TemplateLimitExceeded(f"{what} is too large")
        return
    budget.charge(size, what)


def _check_value(value: object, what: str) -> object:
    """Charge a value a template just built; refuse oversized strings, lists and integers."""
    if isinstance(value, str | list | tuple | dict):
        _charge(len(value), what)
    elif isinstance(value, int) and not isinstance(value, bool):
        _check_int(value)
    return value


def _check_int(value: int) -> None:
    if value.bit_length() > limits.MAX_INT_BITS:
        raise TemplateLimitExceeded(
            f"an integer of more than {limits.MAX_INT_BITS} bits is too large for a template"
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _length(value: object) -> int | None:
    return len(value) if isinstance(value, str | list | tuple) else None


# `%` conversions: a `*` width comes from the arguments; a written width is checked.
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")
_WIDTH = re.compile(r"\d+")


def _check_percent_format(text: str) -> None:
    for width, precision in _PERCENT_SPEC.findall(text):
        for number in (width, precision):
            if number == "*":
                raise TemplateLimitExceeded("'*' widths in % formatting are not supported")
            if number and len(number) > 7 or number and int(number) > limits.MAX_RENDER_CHARS:
                raise TemplateLimitExceeded(f"a format width of {number} is too large")


def _check_brace_format(text: str) -> None:
    for _, _, spec, _ in string.Formatter().parse(text):
        if not spec:
            continue
        if "{" in spec:
            raise TemplateLimitExceeded("nested fields in a format spec are not supported")
        for number in _WIDTH.findall(spec):
            if len(number) > 7 or int(number) > limits.MAX_RENDER_CHARS:
                raise TemplateLimitExceeded(f"a format width of {number} is too large")


def _precheck_binop(operator: str, left: object, right: object) -> None:
    if operator == "**" and _is_int(left) and _is_int(right) and right > 0:
        # At least (bits - 1) * right + 1 bits: refuse before computing it.
        if abs(left) > 1 and (left.bit_length() - 1) * right + 1 > limits.MAX_INT_BITS:
            raise TemplateLimitExceeded(
                f"{left} ** {right} is too large (more than {limits.MAX_INT_BITS} bits)"
            )
    elif operator == "*":
        for sequence, count in ((left, right), (right, left)):
            size = _length(sequence)
            if size is not None and _is_int(count):
                _charge(size * max(count, 0), "a repeated string or list")
                return
    elif operator == "+":
        sizes = (_length(left), _length(right))
        if None not in sizes:
            _charge(sum(sizes), "a concatenated string or list")
    elif operator == "%" and isinstance(left, str):
        _check_percent_format(left)


# --- methods and filters whose result size follows from their arguments ---------------------

_WIDTH_METHODS = frozenset({"center", "ljust", "rjust", "zfill"})


def _precheck_method(method: object, args: tuple, kwargs: dict) -> tuple:
    """Refuse a call of a str method whose result would be too large; return the args
    (an iterable handed to `join` is read once, here, so it can be measured)."""
    target = getattr(method, "__self__", None)
    name = getattr(method, "__name__", "")
    wrapped = getattr(method, "__wrapped__", None)
    if wrapped is not None and isinstance(getattr(wrapped, "__self__", None), str):
        # Jinja's sandboxed str.format / str.format_map wrapper.
        _check_brace_format(wrapped.__self__)
        return args
    if not isinstance(target, str):
        return args
    if name in _WIDTH_METHODS and args and _is_int(args[0]):
        _charge(max(args[0], len(target)), f"str.{name}()")
    elif name == "expandtabs":
        tab = args[0] if args and _is_int(args[0]) else 8
        _charge(len(target) + target.count("\t") * max(tab, 0), "str.expandtabs()")
    elif name == "replace" and len(args) >= 2:
        _charge(_replaced_size(target, args[0], args[1]), "str.replace()")
    elif name == "join" and args:
        items = _materialize(args[0])
        _charge(_joined_size(target, items), "str.join()")
        return (items, *args[1:])
    return args


def _replaced_size(text: str, old: object, new: object) -> int:
    if not isinstance(old, str) or not isinstance(new, str):
        return len(text)
    count = len(text) + 1 if old == "" else text.count(old)
    return len(text) + count * max(len(new) - len(old), 0)


def _materialize(items: object) -> list:
    if isinstance(items, str):
        return list(items)
    if isinstance(items, Mapping):
        return list(items)
    result = []
    for item in items if isinstance(items, Iterable) else ():
        result.append(item)
        if len(result) > limits.MAX_RENDER_CHARS:
            raise TemplateLimitExceeded("an iterable of more than a million items")
    return result


def _joined_size(separator: str, items: list) -> int:
    size = len(separator) * max(len(items) - 1, 0)
    for item in items:
        size += len(item) if isinstance(item, str) else 16
        if size > limits.MAX_RENDER_CHARS:
            break
    return size


def _filter_precheck(name: str, args: tuple, kwargs: dict) -> tuple:
    """Refuse a filter call whose result would be too large before it is computed."""
    value = args[0] if args else None
    rest = args[1:]
    if name == "center":
        width = rest[0] if rest else kwargs.get("width", 80)
        if _is_int(width):
            _charge(max(width, 0), "the center filter")
    elif name == "indent":
        width = rest[0] if rest else kwargs.get("width", 4)
        if _is_int(width) and isinstance(value, str):
            _charge(len(value) + (value.count("\n") + 1) * max(width, 0), "the indent filter")
    elif name == "format" and isinstance(value, str):
        _check_percent_format(value)
    elif name == "replace" and isinstance(value, str) and len(rest) >= 2:
        _charge(_replaced_size(value, rest[0], rest[1]), "the replace filter")
    elif name == "join" and value is not None:
        items = _materialize(value)
        separator = rest[0] if rest else kwargs.get("d", "")
        if isinstance(separator, str):
            _charge(_joined_size(separator, [str(i) if _is_int(i) else i for i in items]),
                    "the join filter")
        return (items, *rest)
    elif name in ("batch", "slice"):
        count = rest[0] if rest else kwargs.get("linecount", kwargs.get("slices"))
        if _is_int(count) and count > limits.MAX_RENDER_CHARS // 10:
            raise TemplateLimitExceeded(f"{name}({count}) is too large")
    elif name == "tojson":
        indent = rest[0] if rest else kwargs.get("indent")
        if _is_int(indent) and indent > 16:
            raise TemplateLimitExceeded("tojson indent must be at most 16")
    elif name == "wordwrap":
        width = rest[0] if rest else kwargs.get("width", 79)
        if _is_int(width) and width < 1:
            raise TemplateLimitExceeded("wordwrap width must be at least 1")
    return args


def _guarded_filter(name: str, function: Callable) -> Callable:
    @functools.wraps(function)  # keeps `jinja_pass_arg`, so Jinja passes the same arguments
    def guarded(*args, **kwargs):
        passed = args[:1] if getattr(function, "jinja_pass_arg", None) else ()
        own = _filter_precheck(name, args[len(passed):], kwargs)
        return _check_value(function(*passed, *own, **kwargs), f"the {name} filter's result")

    return guarded


# --- the environment ----------------------------------------------------------------------------


_LOOP_FILTER = "stepwise_counted"


class _CodeGenerator(CodeGenerator):
    """Jinja's code generator with two checks added: every `{% for %}` iterates through a
    filter that counts iterations against the render's budget, and `~` goes through the
    environment so the size of what it builds is checked."""

    def visit_Template(self, node: nodes.Template, frame=None) -> None:
        # Before code generation starts: Jinja collects the filters a template uses first.
        for loop in node.find_all(nodes.For):
            loop.iter = nodes.Filter(
                loop.iter, _LOOP_FILTER, [], [], None, None, lineno=loop.iter.lineno
            )
        super().visit_Template(node, frame)

    def visit_Concat(self, node: nodes.Concat, frame) -> None:
        self.write("environment.concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


@pass_context
def _finalize(context, value):
    # Taking the context makes every output expression a runtime one: Jinja then never
    # evaluates `{{ ... }}` while compiling, so nothing huge is folded into the cache.
    return value


class _StepwiseSandbox(ImmutableSandboxedEnvironment):
    code_generator_class = _CodeGenerator
    # Intercepted operators are never constant-folded, and each goes through `call_binop`.
    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})
    intercepted_unops = frozenset({"+", "-"})

    def getattr(self, obj, attribute):
        # Data first: a mapping's entry wins over any attribute of the mapping type.
        if isinstance(obj, Mapping):
            try:
                return obj[attribute]
            except (KeyError, TypeError):
                pass
        return super().getattr(obj, attribute)

    def call_binop(self, context, operator, left, right):
        _precheck_binop(operator, left, right)
        result = super().call_binop(context, operator, left, right)
        return _check_value(result, f"the result of {operator!r}")

    def call(__self, __context, __obj, *args, **kwargs):  # Jinja's names: no clash with kwargs
        args = _precheck_method(__obj, args, kwargs)
        result = super().call(__context, __obj, *args, **kwargs)
        return _check_value(result, "a call's result")

    def concat(self, values: tuple) -> str:
        parts = [str(value) for value in values]
        _charge(sum(len(part) for part in parts), "a '~' concatenation")
        return "".join(parts)


def _counted(iterable: object) -> Iterable:
    """Yield from `iterable`, charging each iteration to the render's step budget."""
    budget = _budget.get()
    shared = limits.current_allowance()
    for item in iterable:
        if budget is not None:
            budget.steps_left -= 1
            if budget.steps_left < 0:
                raise TemplateLimitExceeded(
                    f"the template's loops run more than {limits.MAX_RENDER_STEPS:,} "
                    "iterations"
                )
        if shared is not None:
            shared.render_steps -= 1
            if shared.render_steps < 0:
                raise TemplateLimitExceeded(
                    "the definition's templates together run more than "
                    f"{limits.MAX_CHECK_RENDER_STEPS:,} loop iterations to check"
                )
        yield item


def _make_environment() -> _StepwiseSandbox:
    environment = _StepwiseSandbox(
        undefined=StrictUndefined, autoescape=False, optimized=False, finalize=_finalize
    )
    # `lipsum` writes arbitrary amounts of filler text; nothing a workflow needs.
    environment.globals.pop("lipsum", None)
    environment.filters = {
        name: _guarded_filter(name, function) for name, function in environment.filters.items()
    }
    environment.filters[_LOOP_FILTER] = _counted
    return environment


_environment = _make_environment()


# --- compiling and rendering ------------------------------------------------------------------


def compile_template(text: str) -> jinja2.Template:
    """Compile `text`. Raises TemplateError with Jinja's message and line
    (TemplateLimitExceeded for a source longer than MAX_TEMPLATE_CHARS)."""
    if not isinstance(text, str):
        raise TemplateError(f"a template must be a string, not {type(text).__name__}")
    if len(text) > limits.MAX_TEMPLATE_CHARS:
        raise TemplateLimitExceeded(
            f"a template may be at most {limits.MAX_TEMPLATE_CHARS:,} characters long, "
            f"not {len(text):,}"
        )
    return _compile(text)


@lru_cache(maxsize=limits.TEMPLATE_CACHE_SIZE)
def _compile(text: str) -> jinja2.Template:
    try:
        return _environment.from_string(text)
    except jinja2.TemplateSyntaxError as error:
        raise TemplateError(
            f"template syntax error on line {error.lineno}: {error.message}"
        ) from None
    except (RecursionError, MemoryError):
        raise TemplateLimitExceeded("the template nests too deeply to compile") from None


def render_template(text: str, context: dict) -> str:
    """Render `text` with `context`. Raises TemplateError on any failure, and
    TemplateLimitExceeded when the render would exceed a size or cost limit."""
    template = compile_template(text)
    budget = _Budget()
    token = _budget.set(budget)
    try:
        return _collect(template.generate(context))
    except TemplateError:
        raise
    except jinja2.UndefinedError as error:
        raise TemplateUndefined(f"undefined variable: {error.message}") from None
    except SecurityError as error:
        raise TemplateUnsafe(f"unsafe template: {error}") from None
    except (RecursionError, MemoryError):
        raise TemplateLimitExceeded("the template recurses too deeply") from None
    except (jinja2.TemplateError, ArithmeticError, LookupError, TypeError, ValueError) as error:
        raise TemplateError(f"template failed: {error}") from None
    finally:
        _budget.reset(token)


def _collect(chunks: Iterable[str]) -> str:
    parts = []
    size = 0
    for chunk in chunks:
        size += len(chunk)
        if size > limits.MAX_RENDER_CHARS:
            raise TemplateLimitExceeded(
                f"the template renders more than {limits.MAX_RENDER_CHARS:,} characters"
            )
        parts.append(chunk)
    return "".join(parts)


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


def _parse(text: str) -> nodes.Template:
    compile_template(text)  # raises TemplateError with a readable message
    return _parse_cached(text)


@lru_cache(maxsize=limits.TEMPLATE_CACHE_SIZE)
def _parse_cached(text: str) -> nodes.Template:
    return _environment.parse(text)
