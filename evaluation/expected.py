"""The expected outcome of a case: its shape (a JSON Schema) and its check against a workflow.

    {"run":   {"state": "completed", "must_be_approved": true},
     "steps": {"<step>": {"output": {...}}            # the step's whole output
               "<step>": {"labels": ["spam"]}          # the labels a classifier should give
               "<step>": {"action": {"name": "refund", "params": {...}}}  # a proposal's action
               "<step>": {"abstain": true}             # the step should propose nothing
               "<gate>": {"decision": "reject"}}}      # how a reviewer decides (evaluations)

Each part is optional, but an expectation says something: `run` and `steps` each need at least
one key, and a step expects exactly one thing (so each is scored on its own). Against the
workflow's definition: a step must be one of its steps; `action` needs a step that proposes
(`proposal.actions`), one of its action types and params its `params_schema` accepts; `abstain`
needs an agent; `output` is checked against the step's `output_schema` when it has one.

Pure: a value and a normalized definition in, problems out. No database, no clock.
"""
from jsonschema import Draft202012Validator

from orchestrator.engine.definitions.limits import document_problems
from orchestrator.engine.definitions.problems import format_path

from .limits import MAX_EXPECTED_BYTES, MAX_EXPECTED_DEPTH, MAX_LABELS

RUN_STATES = ("completed", "failed", "cancelled", "timed_out", "compensation_failed")

STEP_SCHEMA = {
    "type": "object", "additionalProperties": False, "minProperties": 1, "maxProperties": 1,
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


def _step_problems(expectation: dict, spec: dict, where: tuple) -> list[dict]:
    actions = {a["type"]: a for a in (spec.get("proposal") or {}).get("actions", [])}
    if "action" in expectation:
        action = expectation["action"]
        if not actions:
            return [{"path": _path(where, ("action",)),
                     "message": f"step '{spec['name']}' proposes no action (it has no proposal.actions)"}]
        declared = actions.get(action["name"])
        if declared is None:
            return [{"path": _path(where, ("action", "name")),
                     "message": f"'{action['name']}' is not one of the step's actions ({', '.join(actions)})"}]
        if "params" in action and declared.get("params_schema"):
            return _schema_problems(declared["params_schema"], action["params"], (*where, "action", "params"))
    elif "decision" in expectation and spec.get("type") != "human_gate":
        return [{"path": _path(where, ("decision",)),
                 "message": f"only a human_gate step is decided; '{spec['name']}' is a {spec.get('type')} step"}]
    elif "abstain" in expectation and spec.get("type") != "agent":
        return [{"path": _path(where, ("abstain",)),
                 "message": f"only an agent step abstains; '{spec['name']}' is a {spec.get('type')} step"}]
    elif "output" in expectation and spec.get("output_schema") and not actions:
        return _schema_problems(spec["output_schema"], expectation["output"], (*where, "output"))
    return []


def _schema_problems(schema: dict, value: object, where: tuple) -> list[dict]:
    validator = Draft202012Validator(schema)
    return [{"path": _path(where, error.absolute_path), "message": error.message}
            for error in sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))]
