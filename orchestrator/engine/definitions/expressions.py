"""CEL expressions: compiling, evaluating, and reading what an expression refers to.

Owns every use of `celpy` in Stepwise. Conditions (`when`), router rules and scores, map
`over` lists and scripted-reply conditions are CEL, evaluated against plain data
(`input`, `steps`, and inside a map item `item` and `index`); results come back as plain
Python values. It must never use Python `eval`, and never reach outside the context it
is given.

Names: a dotted read of a map (`steps.items`, `input.keys`) is always the map's entry;
CEL maps have no methods to collide with, so every name the format allows is plain data.

Cost: an expression is at most MAX_EXPRESSION_CHARS long, its syntax tree at most
MAX_EXPRESSION_DEPTH levels deep (checked once, iteratively, when it compiles), and one evaluation may visit at
most MAX_EXPRESSION_COST syntax-tree nodes (macro iterations such as nested `.all()`
count every visit) within MAX_EXPRESSION_SECONDS; `+` and `*` refuse to build strings,
lists or integers past the template limits (`limits.py`). Past a limit the evaluation
stops with `ExpressionLimitExceeded`.
"""

from __future__ import annotations

import base64
import datetime
import operator
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

import celpy
import lark
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError, CELUnsupportedError, Evaluator

from . import limits
from .shapes import UNKNOWN, Unknown

# Macros bind their first argument as a variable local to the other arguments.
_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
# Type names CEL lets an expression mention as values, e.g. `type(x) == string`.
_TYPE_IDENTIFIERS = frozenset(
    {"int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type"}
)


class ExpressionError(Exception):
    """An expression does not compile, or failed while being evaluated."""


class ExpressionLimitExceeded(ExpressionError):
    """An expression is too long, or evaluating it would exceed its cost or size limit."""


class _Budget:
    """What one evaluation may still spend: node visits, and time as a backstop."""

    def __init__(self) -> None:
        self.cost_left = limits.MAX_EXPRESSION_COST
        self.deadline = limits.CpuDeadline(limits.MAX_EXPRESSION_SECONDS)

    def spend(self, cost: int) -> None:
        self.cost_left -= cost
        shared = limits.current_allowance()
        if shared is not None:
            shared.expression_cost -= cost
            if shared.expression_cost < 0:
                raise ExpressionLimitExceeded(
                    "the definition's expressions together cost more than "
                    f"{limits.MAX_CHECK_EXPRESSION_COST:,} evaluation steps to check"
                )
        if self.cost_left < 0:
            raise ExpressionLimitExceeded(
                f"the expression costs more than {limits.MAX_EXPRESSION_COST:,} evaluation "
                "steps (nested macros such as .all() multiply); simplify it"
            )
        if self.cost_left % 256 == 0 and self.deadline.passed():
            raise ExpressionLimitExceeded(
                f"the expression took longer than {limits.MAX_EXPRESSION_SECONDS} s to evaluate"
            )


class _BudgetedEvaluator(Evaluator):
    """celpy's interpreter, charging every node it visits to one shared budget.

    Macros (`all`, `map`, ...) evaluate their body through `sub_evaluator` once per
    element, so their iterations are charged to the same budget.
    """

    def __init__(self, ast: lark.Tree, activation, budget: _Budget) -> None:
        super().__init__(ast, activation=activation)
        self.budget = budget

    def sub_evaluator(self, ast: lark.Tree) -> Evaluator:
        return _BudgetedEvaluator(ast, self.activation, self.budget)

    def visit(self, tree):
        self.budget.spend(1)
        return super().visit(tree)

    def visit_children(self, tree):
        self.budget.spend(len(tree.children))
        return super().visit_children(tree)


class _BudgetedRunner(celpy.InterpretedRunner):
    def evaluate(self, context):
        evaluator = _BudgetedEvaluator(self.ast, self.new_activation(), _Budget())
        return evaluator.evaluate(context)


def _sized(result: object) -> object:
    if isinstance(result, str | bytes | list | tuple) and len(result) > limits.MAX_RENDER_CHARS:
        raise ExpressionLimitExceeded(
            f"the expression builds a value of more than {limits.MAX_RENDER_CHARS:,} items"
        )
    if isinstance(result, int) and result.bit_length() > limits.MAX_INT_BITS:
        raise ExpressionLimitExceeded("the expression builds an integer that is too large")
    return result


def _length(value: object) -> int | None:
    return len(value) if isinstance(value, str | bytes | list | tuple) else None


def _checked_add(left, right):
    sizes = (_length(left), _length(right))
    if None not in sizes and sum(sizes) > limits.MAX_RENDER_CHARS:
        _sized(range(sum(sizes)))  # refused before it is built
    return _sized(operator.add(left, right))


def _checked_mul(left, right):
    for sequence, count in ((left, right), (right, left)):
        size = _length(sequence)
        if size is not None and isinstance(count, int) and size * count > limits.MAX_RENDER_CHARS:
            raise ExpressionLimitExceeded(
                f"the expression builds a value of more than {limits.MAX_RENDER_CHARS:,} items"
            )
    return _sized(operator.mul(left, right))


_FUNCTIONS = {"_+_": _checked_add, "_*_": _checked_mul}


@lru_cache(maxsize=1)
def _environment() -> celpy.Environment:
    """Built on first use: building CEL's parser is a large part of starting a process, and
    many (beat, the relay, most commands) never evaluate an expression."""
    return celpy.Environment(runner_class=_BudgetedRunner)


@dataclass(frozen=True)
class CompiledExpression:
    text: str
    tree: lark.Tree
    program: celpy.Runner


def compile_expression(text: str) -> CompiledExpression:
    """Parse `text` as CEL. Raises ExpressionError with the parser's message
    (ExpressionLimitExceeded for a text longer than MAX_EXPRESSION_CHARS)."""
    if not isinstance(text, str):
        raise ExpressionError(f"an expression must be a string, not {type(text).__name__}")
    if not text.strip():
        raise ExpressionError("an expression must not be empty")
    if len(text) > limits.MAX_EXPRESSION_CHARS:
        raise ExpressionLimitExceeded(
            f"an expression may be at most {limits.MAX_EXPRESSION_CHARS:,} characters long, "
            f"not {len(text):,}"
        )
    _check_nesting(text)
    return _compile(text)


_OPENING, _CLOSING, _UNARY = "([{", ")]}", "!-"


def _check_nesting(text: str) -> None:
    """Refuse, before parsing, a text whose brackets or unary operators nest so deep that
    its syntax tree would pass MAX_EXPRESSION_DEPTH anyway (each bracket adds at least ten
    levels, each unary operator one); parsing such a text is itself the costly part."""
    depth = deepest = run = longest = 0
    quote = ""
    escaped = False
    for char in text:
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
            continue
        if char in "'\"":
            quote = char
        elif char in _OPENING:
            depth += 1
            deepest = max(deepest, depth)
        elif char in _CLOSING:
            depth -= 1
        if char in _UNARY:
            run += 1
            longest = max(longest, run)
        elif not char.isspace():
            run = 0
    if deepest * 10 > limits.MAX_EXPRESSION_DEPTH or longest > limits.MAX_EXPRESSION_DEPTH:
        raise ExpressionLimitExceeded(
            f"the expression nests too deeply (more than {limits.MAX_EXPRESSION_DEPTH // 10} "
            f"brackets or {limits.MAX_EXPRESSION_DEPTH} unary operators deep)"
        )


@lru_cache(maxsize=limits.EXPRESSION_CACHE_SIZE)
def _compile(text: str) -> CompiledExpression:
    try:
        environment = _environment()
        tree = environment.compile(text)
        program = environment.program(tree, functions=_FUNCTIONS)
    except CELParseError as error:
        raise ExpressionError(f"CEL syntax error: {str(error).rstrip()}") from None
    except (CELUnsupportedError, lark.LarkError) as error:
        raise ExpressionError(f"CEL error: {error}") from None
    except RecursionError:
        raise ExpressionLimitExceeded("the expression nests too deeply") from None
    _check_depth(tree)
    return CompiledExpression(text, tree, program)


def _check_depth(tree: lark.Tree) -> None:
    """Refuse a syntax tree deeper than MAX_EXPRESSION_DEPTH: the walkers here and celpy's
    evaluator recurse once per level, so depth is checked once, iteratively, at compile."""
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limits.MAX_EXPRESSION_DEPTH:
            raise ExpressionLimitExceeded(
                f"the expression nests too deeply (its syntax tree is deeper than "
                f"{limits.MAX_EXPRESSION_DEPTH} levels); use fewer nested parentheses "
                "or operators"
            )
        stack.extend(
            (child, depth + 1) for child in node.children if isinstance(child, lark.Tree)
        )


def evaluate_expression(text: str, context: dict) -> object:
    """Evaluate CEL `text` over `context` (plain JSON-like data) and return plain Python.

    Raises ExpressionError if `text` does not compile or evaluation fails (missing key,
    mismatched types, division by zero), ExpressionLimitExceeded past a cost or size limit.
    """
    compiled = compile_expression(text)
    try:
        activation = {name: _to_cel(value) for name, value in context.items()}
    except (TypeError, ValueError) as error:
        raise ExpressionError(f"context is not JSON-like data: {error}") from None
    try:
        result = compiled.program.evaluate(activation)
    except ExpressionError:
        raise
    except CELEvalError as error:
        raise ExpressionError(_eval_error_message(error)) from None
    except RecursionError:
        raise ExpressionLimitExceeded("the expression nests too deeply") from None
    except (CELUnsupportedError, ArithmeticError, LookupError, TypeError, ValueError) as error:
        raise ExpressionError(f"cannot evaluate {text!r}: {error}") from None
    # Some failures come back as a value instead of being raised.
    if isinstance(result, CELEvalError):
        raise ExpressionError(_eval_error_message(result))
    return to_python(result)


class _UnknownMap(celtypes.MapType):
    """`shapes.Unknown` in CEL: every member is another unknown; comparing it is a type
    error, which validation does not report."""

    def __getitem__(self, key):
        return _UnknownMap()

    def __contains__(self, key) -> bool:
        return True


def _to_cel(value: object) -> object:
    if isinstance(value, Unknown):
        return _UnknownMap()
    if isinstance(value, dict):
        return celtypes.MapType(
            {celtypes.StringType(key): _to_cel(item) for key, item in value.items()}
        )
    if isinstance(value, list | tuple):
        return celtypes.ListType([_to_cel(item) for item in value])
    return celpy.json_to_cel(value)


def expression_roots(text: str) -> set[str]:
    """The top-level identifiers `text` reads, e.g. ``{"steps", "input"}``.

    Variables bound by macros (``x`` in ``list.exists(x, x > 1)``) and CEL type names are
    not roots. Raises ExpressionError if `text` does not compile.
    """
    return {name for name, _ in _walk(compile_expression(text).tree, frozenset())}


def referenced_steps(text: str) -> set[str]:
    """Names X of every ``steps.X`` / ``steps["X"]`` read by `text`.

    Raises ExpressionError if `text` does not compile.
    """
    return {step for name, step in _walk(compile_expression(text).tree, frozenset()) if step}


def to_python(value: object) -> object:
    """Convert a celtypes value to bool/int/float/str/list/dict/None.

    Timestamps become ISO-8601 strings, durations seconds (float), bytes base64 text.
    """
    if value is None:
        return None
    if isinstance(value, _UnknownMap):
        return UNKNOWN
    if isinstance(value, celtypes.BoolType | bool):
        return bool(value)
    if isinstance(value, celtypes.DoubleType | float):
        return float(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, dict):
        return {str(to_python(key)): to_python(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [to_python(item) for item in value]
    return str(value)


_OPERATORS = {
    "addition_add": "+",
    "addition_sub": "-",
    "multiplication_mul": "*",
    "multiplication_div": "/",
    "multiplication_mod": "%",
    "relation_lt": "<",
    "relation_le": "<=",
    "relation_gt": ">",
    "relation_ge": ">=",
    "relation_eq": "==",
    "relation_ne": "!=",
    "relation_in": "in",
    "unary_neg": "unary -",
    "unary_not": "!",
}


def _eval_error_message(error: CELEvalError) -> str:
    # celpy's messages embed its whole activation and internal class names; keep the gist.
    message = error.args[0] if error.args and isinstance(error.args[0], str) else str(error)
    message = message.split(" (in activation", 1)[0]
    message = re.sub(
        r"Token\('RULE', '(\w+)'\)", lambda m: repr(_OPERATORS.get(m[1], m[1])), message
    )
    message = re.sub(r"<class 'celpy\.celtypes\.(\w+?)(?:Type)?'>", lambda m: m[1].lower(), message)
    return message


def _walk(node: object, bound: frozenset[str]) -> Iterator[tuple[str, str | None]]:
    """Yield (root identifier, step name or None) for every free identifier under `node`."""
    if not isinstance(node, lark.Tree):
        return
    if node.data in ("ident", "dot_ident"):
        name = _token_text(node.children[-1])
        if name not in bound and name not in _TYPE_IDENTIFIERS:
            yield name, None
        return
    if node.data in ("member_dot", "member_index") and _is_free_steps(node.children[0], bound):
        yield "steps", _step_name(node)
        if node.data == "member_index":
            yield from _walk(node.children[1], bound)
        return
    if node.data == "member_dot_arg":
        target, method, *rest = node.children
        yield from _walk(target, bound)
        arguments = list(rest[0].children) if rest and isinstance(rest[0], lark.Tree) else []
        if _token_text(method) in _MACROS and arguments:
            variable = _bare_identifier(arguments[0])
            if variable is not None:
                for argument in arguments[1:]:
                    yield from _walk(argument, bound | {variable})
                return
        for argument in arguments:
            yield from _walk(argument, bound)
        return
    if node.data in ("ident_arg", "dot_ident_arg"):
        # The function name is not a variable; its arguments may use variables.
        for child in node.children[1:]:
            yield from _walk(child, bound)
        return
    if node.data == "member_object":
        # `Message{field: value}`: field names are not variables.
        yield from _walk(node.children[0], bound)
        for child in node.children[1:]:
            if isinstance(child, lark.Tree):
                for grandchild in child.children:
                    yield from _walk(grandchild, bound)
        return
    for child in node.children:
        yield from _walk(child, bound)


def _is_free_steps(node: object, bound: frozenset[str]) -> bool:
    # member -> primary -> ident "steps"
    while (
        isinstance(node, lark.Tree)
        and node.data in ("member", "primary")
        and len(node.children) == 1
    ):
        node = node.children[0]
    return (
        isinstance(node, lark.Tree)
        and node.data == "ident"
        and _token_text(node.children[0]) == "steps"
        and "steps" not in bound
    )


def _step_name(node: lark.Tree) -> str | None:
    if node.data == "member_dot":
        return _token_text(node.children[1])
    literal = _single_literal(node.children[1])
    if literal is not None and literal.type in ("STRING_LIT",):
        return _unquote(literal.value)
    return None  # a computed index such as steps[input.name]: not statically known


def _bare_identifier(node: object) -> str | None:
    while isinstance(node, lark.Tree) and len(node.children) == 1 and node.data != "ident":
        node = node.children[0]
    if isinstance(node, lark.Tree) and node.data == "ident":
        return _token_text(node.children[0])
    return None


def _single_literal(node: object) -> lark.Token | None:
    while isinstance(node, lark.Tree) and len(node.children) == 1:
        if node.data == "literal":
            child = node.children[0]
            return child if isinstance(child, lark.Token) else None
        node = node.children[0]
    return None


def _unquote(literal: str) -> str | None:
    body = literal
    if body[:1] in "rR":
        body = body[1:]
    if len(body) >= 2 and body[0] == body[-1] and body[0] in "'\"":
        inner = body[1:-1]
        return inner if "\\" not in inner else None
    return None


def _token_text(token: object) -> str:
    return str(token.value) if isinstance(token, lark.Token) else str(token)
