"""The expected outcome of a case: its shape (a JSON Schema) and its check against a workflow.

    {"run":   {"state": "completed", "must_be_approved": true},
     "steps": {"<step>": {"output": {...}}            # the step's whole output
               "<step>": {"labels": ["spam"]}          # the labels a classifier should give
               "<step>": {"action": {"name": "refund", "params": {...}}}  # a proposal's action
               "<step>": {"abstain": true}             # the step should propose nothing
               "<gate>": {"decision": "reject"}},      # how a reviewer decides (evaluations)
     "scorers": ["refund_within_total"]}               # registered code scorers to run too

Each part is optional, but an expectation says something: `run` and `steps` each need at least
one key, and a step expects at most one of output, labels, action and abstain (so each is
scored on its own). Beside it a step may carry how it is scored (docs/evaluation-scoring.md):
`match` (`exact`, the default; `subset`: only what is given must match; `schema`: the expected
value is a JSON Schema the output or params must satisfy), `tolerance` (how far a number may
be off) and `rubric` ({"text", "min_score"}: a model grades the step's output against the text;
a rubric alone is an expectation too). Against the workflow's definition: a step must be one
of its steps; `action` needs a step that proposes (`proposal.actions`), one of its action
types and params its `params_schema` accepts; `abstain` needs an agent; `output` is checked
against the step's `output_schema` when it has one (an exact match only: a subset or a schema
is not an output). Every scorer named must be registered (`evaluation.scorers`).

Pure: a value and a normalized definition in, problems out (and the registry of code scorers
read). No database, no clock.
"""
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from orchestrator.engine.definitions.limits import document_problems
from orchestrator.engine.definitions.problems import format_path

from . import scorers
from .limits import (
    MAX_EXPECTED_BYTES,
    MAX_EXPECTED_DEPTH,
    MAX_LABELS,
    MAX_RUBRIC_CHARS,
    MAX_SCORERS,
)

RUN_STATES = ("completed", "failed", "cancelled", "timed_out", "compensation_failed")
#: What a step may expect; at most one of them.
KINDS = ("output", "labels", "action", "abstain", "decision")
MATCHES = ("exact", "subset", "schema")

STEP_SCHEMA = {
    "description": "What one step should do: at most one of output, labels, action and abstain, "
                   "and how it is scored (match, tolerance, rubric).",
    "type": "object", "additionalProperties": False, "minProperties": 1,
    "properties": {
        "output": {"description": "The step's whole output."},
        "labels": {"type": "array", "maxItems": MAX_LABELS, "uniqueItems": True,
                   "items": {"type": "string", "minLength": 1, "maxLength": 200}},
        "action": {"type": "object", "additionalProperties": False, "required": ["name"],
                   "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 100},
                                  "params": {"type": "object"}}},
        "abstain": {"type": "boolean", "enum": [True]},
        "decision": {"enum": ["approve", "reject"],
                     "description": "How a human gate is decided when the case is evaluated."},
        "match": {"enum": list(MATCHES), "description": "How an output, or an action's params, is "
                  "matched: exact (the default), subset (only what is given), schema (the expected "
                  "value is a JSON Schema)."},
        "tolerance": {"type": "number", "minimum": 0, "description": "How far a number may be off."},
        "rubric": {"type": "object", "additionalProperties": False, "required": ["text"],
                   "description": "A model grades the step's output against `text`; it passes at "
                                  "`min_score` (0 to 1, default 0.7) or more.",
                   "properties": {"text": {"type": "string", "minLength": 1, "maxLength": MAX_RUBRIC_CHARS},
                                  "min_score": {"type": "number", "minimum": 0, "maximum": 1}}},
    },
}

SCHEMA = {
    "description": "The expected outcome of an evaluation case (docs/evaluation.md).",
    "type": "object", "additionalProperties": False, "minProperties": 1,
    "properties": {
        "run": {"type": "object", "additionalProperties": False, "minProperties": 1,
                "properties": {"state": {"enum": list(RUN_STATES)},
                               "must_be_approved": {"type": "boolean"}}},
        "steps": {"type": "object", "minProperties": 1, "additionalProperties": STEP_SCHEMA},
        "scorers": {"type": "array", "minItems": 1, "maxItems": MAX_SCORERS, "uniqueItems": True,
                    "items": {"type": "string", "pattern": scorers.NAME.pattern},
                    "description": "Registered code scorers to run on the case too."},
    },
}
_VALIDATOR = Draft202012Validator(SCHEMA)


def _path(prefix: tuple, parts) -> str:
    return format_path((*prefix, *parts))


def expected_problems(value: object, definition: dict, *, at: tuple = ("expected",)) -> list[dict]:
    """Every way `value` is not an expected outcome of a run of `definition` (normalized), as
    [{"path", "message"}] with paths under `at`."""
    size = [{"path": _path(at, parts), "message": message} for parts, message in document_problems(
        value, max_bytes=MAX_EXPECTED_BYTES, max_depth=MAX_EXPECTED_DEPTH, what="the expected outcome")]
    if size:
        return size
    problems = [{"path": _path(at, error.absolute_path), "message": error.message}
                for error in sorted(_VALIDATOR.iter_errors(value), key=lambda e: list(e.absolute_path))]
    if problems:
        return problems
    problems = [problem for name, expectation in (value.get("steps") or {}).items()
                for problem in _shape_problems(expectation, (*at, "steps", name))]
    if problems:
        return problems
    known = scorers.registered()
    for index, name in enumerate(value.get("scorers") or []):
        if name not in known:
            problems.append({"path": _path(at, ("scorers", index)), "message":
                             f"no code scorer is registered as '{name}' (registered: {', '.join(sorted(known)) or 'none'})"})
    specs = {step["name"]: step for step in definition.get("steps", [])}
    for name, expectation in (value.get("steps") or {}).items():
        where = (*at, "steps", name)
        spec = specs.get(name)
        if spec is None:
            problems.append({"path": _path(where, ()), "message":
                             f"the workflow has no step '{name}' (its steps: {', '.join(specs)})"})
            continue
        problems += _step_problems(expectation, spec, where)
    return problems


def _shape_problems(expectation: dict, where: tuple) -> list[dict]:
    """What the schema cannot say: one thing expected, and scoring options that fit it."""
    kinds = [kind for kind in KINDS if kind in expectation]
    if len(kinds) > 1:
        return [{"path": _path(where, ()), "message":
                 f"a step expects one of {', '.join(KINDS)}, not {' and '.join(kinds)}"}]
    kind = kinds[0] if kinds else None
    if kind is None and "rubric" not in expectation:
        return [{"path": _path(where, ()), "message":
                 f"a step expects one of {', '.join(KINDS)} or is graded by a rubric"}]
    match = expectation.get("match", "exact")
    has_params = kind == "action" and "params" in expectation["action"]
    if "match" in expectation and not (kind == "output" or has_params or (kind == "labels" and match != "schema")):
        return [{"path": _path(where, ("match",)), "message":
                 "match applies to an output, an action's params or (exact, subset) labels"}]
    if "tolerance" in expectation and not ((kind == "output" or has_params) and match != "schema"):
        return [{"path": _path(where, ("tolerance",)), "message":
                 "tolerance applies to the numbers of an output or an action's params, matched exact or subset"}]
    if match == "schema":
        value = expectation["output"] if kind == "output" else expectation["action"]["params"]
        try:
            Draft202012Validator.check_schema(value)
        except SchemaError as error:
            path = ("output",) if kind == "output" else ("action", "params")
            return [{"path": _path(where, (*path, *error.absolute_path)),
                     "message": f"with match: schema this is a JSON Schema: {error.message}"}]
    return []


def _step_problems(expectation: dict, spec: dict, where: tuple) -> list[dict]:
    actions = {a["type"]: a for a in (spec.get("proposal") or {}).get("actions", [])}
    exact = expectation.get("match", "exact") == "exact"
    if "action" in expectation:
        action = expectation["action"]
        if not actions:
            return [{"path": _path(where, ("action",)),
                     "message": f"step '{spec['name']}' proposes no action (it has no proposal.actions)"}]
        declared = actions.get(action["name"])
        if declared is None:
            return [{"path": _path(where, ("action", "name")),
                     "message": f"'{action['name']}' is not one of the step's actions ({', '.join(actions)})"}]
        if "params" in action and declared.get("params_schema") and exact:
            return _schema_problems(declared["params_schema"], action["params"], (*where, "action", "params"))
    elif "decision" in expectation and spec.get("type") != "human_gate":
        return [{"path": _path(where, ("decision",)),
                 "message": f"only a human_gate step is decided; '{spec['name']}' is a {spec.get('type')} step"}]
    elif "abstain" in expectation and spec.get("type") != "agent":
        return [{"path": _path(where, ("abstain",)),
                 "message": f"only an agent step abstains; '{spec['name']}' is a {spec.get('type')} step"}]
    elif "output" in expectation and spec.get("output_schema") and not actions and exact:
        return _schema_problems(spec["output_schema"], expectation["output"], (*where, "output"))
    return []


def _schema_problems(schema: dict, value: object, where: tuple) -> list[dict]:
    validator = Draft202012Validator(schema)
    return [{"path": _path(where, error.absolute_path), "message": error.message}
            for error in sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))]
