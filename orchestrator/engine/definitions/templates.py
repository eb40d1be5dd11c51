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
  it builds, the total it builds, what it outputs, the loop iterations it runs and its
  time (`limits.py`). Sizes are checked at the operation, before it allocates: `*`, `+`,
  `~`, `%` and the `format` filter, `str.format`/`format_map` (field by field, with a
  running total), method calls such as `join`, `replace`, `center`, and every conversion of
  a list or mapping to text (output, `~`, filters, `!r`/`%s`), whose size is bounded from
  its items without building it, so a list of a million references to one long string
  cannot be printed. A render past a limit fails with `TemplateLimitExceeded`; the compiled
  template cache is bounded in entries and each entry by the template's source size.

It must not decide which variables a step may use; `validation.py` does that with
`template_names`, `template_step_references` and `template_render_problem`.
"""

from __future__ import annotations

import contextvars
import functools
import re
import types
from collections.abc import Callable, ItemsView, Iterable, KeysView, Mapping, ValuesView
from functools import lru_cache

import jinja2
from jinja2 import StrictUndefined, meta, nodes, pass_context
from jinja2.compiler import CodeGenerator
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter
from jinja2.utils import Namespace

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
    """What one render may still spend: characters built in total, loop iterations, time."""

    def __init__(self) -> None:
        self.max_chars = limits.MAX_RENDER_CHARS
        self.chars_left = self.max_chars * 8
        self.steps_left = limits.MAX_RENDER_STEPS
        self.deadline = limits.CpuDeadline(limits.MAX_RENDER_SECONDS)

    def tick(self) -> None:
        if self.deadline.passed():
            raise TemplateLimitExceeded(
                f"the template took longer than {limits.MAX_RENDER_SECONDS} s to render"
            )

    def charge(self, size: int, what: str) -> None:
        self.tick()
        if size > self.max_chars:
            raise TemplateLimitExceeded(
                f"{what} would be {size:,} long; the limit is {self.max_chars:,}"
            )
        self.chars_left -= size
        if self.chars_left < 0:
            raise TemplateLimitExceeded(
                f"the template builds more than {self.max_chars * 8:,} characters "
                "of values in total"
            )


_budget: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar(
    "template_budget", default=None
)


def _limit() -> int:
    budget = _budget.get()
    return limits.MAX_RENDER_CHARS if budget is None else budget.max_chars


def _tick() -> None:
    budget = _budget.get()
    if budget is not None:
        budget.tick()


def _charge(size: int, what: str) -> None:
    budget = _budget.get()
    if budget is None:  # outside a render (e.g. a filter folded while compiling): refuse big
        if size > limits.MAX_RENDER_CHARS:
            raise TemplateLimitExceeded(f"{what} is too large")
        return
    budget.charge(size, what)


def _check_value(value: object, what: str) -> object:
    """Charge a value a template just built; refuse oversized strings, lists and integers."""
    if isinstance(value, str | bytes | bytearray | list | tuple | dict):
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
    return len(value) if isinstance(value, str | bytes | bytearray | list | tuple) else None


def _text_size(value: object, *, nested: bool = False) -> int:
    """An upper bound of len(str(value)) (of repr when `nested`), counted from the items
    without building the text, and stopping as soon as it passes the render's limit."""
    cap = _limit()
    size = 0
    stack: list[tuple[object, bool]] = [(value, nested)]
    while stack:
        node, inner = stack.pop()
        if isinstance(node, str):
            size += _repr_size(node) if inner else len(node)
        elif isinstance(node, bytes | bytearray):
            size += len(node) * 4 + 3
        elif isinstance(node, bool) or node is None:
            size += 5
        elif isinstance(node, int):
            size += node.bit_length() * 30103 // 100000 + 2
        elif isinstance(node, float):
            size += 24
        elif isinstance(node, Mapping | ItemsView):
            items = node.items() if isinstance(node, Mapping) else node
            size += 16 + 4 * len(items)
            for key, item in items:
                stack.append((key, True))
                stack.append((item, True))
                if len(stack) > cap:  # never more pending items than the limit allows
                    return cap + 1
        elif isinstance(node, list | tuple | set | frozenset | KeysView | ValuesView):
            size += 16 + 2 * len(node)
            if size > cap:
                return size
            stack.extend((item, True) for item in node)
        elif isinstance(node, Namespace):
            stack.append((dict(node._Namespace__attrs), True))  # its repr shows its attributes
        else:
            size += 100  # functions, Undefined, ranges, generators: a short fixed repr
        _tick()
        if size > cap:
            return size
    return size


def _repr_size(text: str) -> int:
    if text.isascii() and text.isprintable():
        return len(text) + 2
    return len(repr(text))  # at most ten times a string the limit already bounds


def _check_text(value: object, what: str) -> None:
    """Refuse converting `value` to text when the text would pass the render's limit."""
    if isinstance(value, str):
        return
    size = _text_size(value)
    if size > _limit():
        raise TemplateLimitExceeded(
            f"{what} would be more than {_limit():,} characters long as text"
        )


_WIDTH = re.compile(r"\d+")


def _check_widths(spec: str) -> None:
    for number in _WIDTH.findall(spec):
        if len(number) > 7 or int(number) > _limit():
            raise TemplateLimitExceeded(f"a format width of {number} is too large")


# One `%` conversion: (mapping key, flags, width, precision, conversion character).
_PERCENT_SPEC = re.compile(r"%(?:\(([^)]*)\))?([-#0 +]*)(\*|\d+)?(?:\.(\*|\d*))?[hlL]?(.?)", re.S)
_NUMBER_TEXT = 330  # digits of the largest float, with sign, point and exponent


def _check_percent_format(text: str, values: object) -> None:
    """Refuse `text % values` when its result could pass the render's limit: each
    conversion's size follows from its width, precision and the value it formats."""
    cap = _limit()
    positional = values if isinstance(values, tuple) else (values,)
    mapping = values if isinstance(values, Mapping) else None
    size = len(text)
    index = 0
    for key, _flags, width, precision, kind in _PERCENT_SPEC.findall(text):
        if kind == "%":
            continue
        if "*" in (width, precision):
            raise TemplateLimitExceeded("'*' widths in % formatting are not supported")
        _check_widths(f"{width}.{precision}")
        if key and mapping is not None:
            value = mapping.get(key)
        elif index < len(positional):
            value = positional[index]
            index += 1
        else:
            value = None  # Python's own `%` reports the missing argument
        if kind in ("s", "r", "a"):
            piece = _text_size(value, nested=kind != "s")
            if precision:
                piece = min(piece, int(precision))
        elif kind == "c":
            piece = 1
        else:
            bits = value.bit_length() if _is_int(value) else 0
            piece = int(precision or 0) + _NUMBER_TEXT + bits // 3
        size += max(int(width or 0), piece)
        _tick()
        if size > cap:
            raise TemplateLimitExceeded(
                f"'%' formatting would build more than {cap:,} characters"
            )


class _BudgetedFormatter(SandboxedFormatter):
    """Jinja's sandboxed `str.format`, checking every field before it is formatted and the
    running total after each one."""

    def vformat(self, format_string, args, kwargs):
        self.built = len(format_string)
        return super().vformat(format_string, args, kwargs)

    def convert_field(self, value, conversion):
        if conversion is not None:
            _check_text(value, "a format field")
        return super().convert_field(value, conversion)

    def format_field(self, value, format_spec):
        _check_widths(format_spec)
        _check_text(value, "a format field")
        result = super().format_field(value, format_spec)
        self.built += len(result)
        if self.built > _limit():
            raise TemplateLimitExceeded(
                f"str.format() would build more than {_limit():,} characters"
            )
        _charge(len(result), "a format field")
        return result


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
        _check_percent_format(left, right)


# --- methods and filters whose result size follows from their arguments ---------------------

_LOOP_FILTER_NAME = "stepwise_counted"

_WIDTH_METHODS = frozenset({"center", "ljust", "rjust", "zfill"})


def _precheck_method(method: object, args: tuple, kwargs: dict) -> tuple:
    """Refuse a call of a str (or bytes) method whose result would be too large; return
    the args (an iterable handed to `join` is read once, here, so it can be measured).
    `str.format` and `format_map` are checked field by field by `_BudgetedFormatter`."""
    target = getattr(method, "__self__", None)
    name = getattr(method, "__name__", "")
    if not isinstance(target, str | bytes | bytearray):
        return args
    if name in _WIDTH_METHODS and args and _is_int(args[0]):
        _charge(max(args[0], len(target)), f"str.{name}()")
    elif name == "translate" and args:
        _charge(len(target) * _longest_value(args[0]), "str.translate()")
    elif name == "hex":
        _charge(len(target) * 3, f"{type(target).__name__}.hex()")
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


def _longest_value(table: object) -> int:
    if not isinstance(table, Mapping):
        return 1
    return max([1, *(len(v) for v in table.values() if isinstance(v, str | bytes))])


def _replaced_size(text: str, old: object, new: object) -> int:
    if not isinstance(old, str | bytes) or not isinstance(new, str | bytes):
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
        size += len(item) if isinstance(item, str | bytes) else _text_size(item)
        if size > _limit():
            break
    return size


# Filters that never turn their value into text; every other filter may, so a list or
# mapping handed to one is measured as text first.
_NON_TEXT_FILTERS = frozenset({
    "attr", "batch", "count", "d", "default", "dictsort", "first", "groupby", "items",
    "last", "length", "list", "map", "max", "min", "random", "reject", "rejectattr",
    "reverse", "select", "selectattr", "slice", "sort", "sum", "unique", _LOOP_FILTER_NAME,
})


def _filter_precheck(name: str, args: tuple, kwargs: dict) -> tuple:
    """Refuse a filter call whose result would be too large before it is computed."""
    value = args[0] if args else None
    rest = args[1:]
    _tick()
    if name not in _NON_TEXT_FILTERS and name != "join":
        _check_text(value, f"the {name} filter's value")
    if name == "sum" and not _is_int(kwargs.get("start", rest[1] if len(rest) > 1 else 0)):
        # Summing lists or strings concatenates them: measure before the quadratic build.
        items = _materialize(value)
        _charge(sum(_length(item) or 0 for item in items), "the sum filter")
        return (items, *rest)
    if name == "center":
        width = rest[0] if rest else kwargs.get("width", 80)
        if _is_int(width):
            _charge(max(width, 0), "the center filter")
    elif name == "indent":
        width = rest[0] if rest else kwargs.get("width", 4)
        if _is_int(width) and isinstance(value, str):
            _charge(len(value) + (value.count("\n") + 1) * max(width, 0), "the indent filter")
    elif name == "format" and isinstance(value, str):
        _check_percent_format(value, kwargs or tuple(rest))
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


_LOOP_FILTER = _LOOP_FILTER_NAME


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
    _check_text(value, "an output value")
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

    def wrap_str_format(self, value):
        # Jinja's own wrapper, with a formatter that checks each field as it is formatted.
        if not isinstance(value, types.MethodType | types.BuiltinMethodType) or (
            value.__name__ not in ("format", "format_map")
        ):
            return None
        target = value.__self__
        if not isinstance(target, str):
            return None
        vformat = _BudgetedFormatter(self).vformat
        is_format_map = value.__name__ == "format_map"

        def wrapper(*args, **kwargs):
            if is_format_map:
                if kwargs or len(args) != 1:
                    raise TypeError("format_map() takes exactly one argument")
                args, kwargs = (), args[0]
            return str(vformat(target, args, kwargs))

        return functools.update_wrapper(wrapper, value)

    def call_binop(self, context, operator, left, right):
        _precheck_binop(operator, left, right)
        result = super().call_binop(context, operator, left, right)
        return _check_value(result, f"the result of {operator!r}")

    def call(__self, __context, __obj, *args, **kwargs):  # Jinja's names: no clash with kwargs
        _tick()
        args = _precheck_method(__obj, args, kwargs)
        result = super().call(__context, __obj, *args, **kwargs)
        return _check_value(result, "a call's result")

    def concat(self, values: tuple) -> str:
        for value in values:
            _check_text(value, "a '~' operand")
        parts = [str(value) for value in values]
        _charge(sum(len(part) for part in parts), "a '~' concatenation")
        return "".join(parts)


def _counted(iterable: object) -> Iterable:
    """Yield from `iterable`, charging each iteration to the render's step budget."""
    budget = _budget.get()
    shared = limits.current_allowance()
    for item in iterable:
        if budget is not None:
            budget.tick()
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
        if size > _limit():
            raise TemplateLimitExceeded(
                f"the template renders more than {_limit():,} characters"
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
    return template_references(text, "steps")


def template_references(text: str, root: str) -> set[str]:
    """Names X of every ``<root>.X`` / ``<root>['X']`` in `text`. Raises TemplateError."""
    tree = _parse(text)
    found = set()
    for node in tree.find_all((nodes.Getattr, nodes.Getitem)):
        if not (isinstance(node.node, nodes.Name) and node.node.name == root):
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
