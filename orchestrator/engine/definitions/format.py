"""The workflow definition format: its vocabulary, its defaults and its JSON Schema.

Owns the single description of what a definition may contain. The structural validator
checks documents against `definition_format_schema()`, the API serves the same schema,
and `normalize.py` fills the defaults declared here. It must not contain any check that
needs more than one field at a time (references, graph, expressions); those live in
`validation.py`.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

from . import limits

SCHEMA_ID = "https://stepwise.dev/schema/definition.json"

# "validate" is an API route (POST /api/v1/workflows/validate/), so it cannot name a workflow.
WORKFLOW_NAME_PATTERN = r"^(?!validate$)[a-z][a-z0-9_-]{0,99}$"
STEP_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
STEP_RUN_NAME_CHARS = 64  # StepRun.name: a step's name, or a loop body step's with `[N]`

STEP_TYPES = ("agent", "tool", "router", "map", "human_gate", "sub_workflow", "loop", "sleep",
              "human_input", "wait")
MAP_ITEM_TYPES = ("agent", "tool")
# A loop's body runs on workers only: no gate, map, child run or loop inside an iteration.
LOOP_BODY_TYPES = ("agent", "tool", "router")
ON_ERROR_CHOICES = ("fail", "pause", "continue")
# A run past budget.max_duration_s: paused for an operator, or failed (timed_out).
ON_DURATION_CHOICES = ("pause", "fail")
JOIN_CHOICES = ("all", "any")
BACKOFF_CHOICES = ("exponential", "linear", "fixed")
ROUTER_STRATEGIES = ("rules", "score", "llm")
MERGE_STRATEGIES = ("list", "dict_merge", "first_success")


def calls_model(spec: dict) -> bool:
    """Whether a step (or map item body) asks a model: an agent, or a router with strategy llm."""
    return spec["type"] == "agent" or (spec["type"] == "router" and spec.get("strategy") == "llm")
RETRYABLE_ERRORS = ("timeout", "rate_limit", "transient", "invalid_output")
SCRIPTED_ERRORS = (*RETRYABLE_ERRORS, "auth", "permanent")
RISK_TIERS = ("low", "medium", "high", "critical")
ACTION_TYPE_PATTERN = r"^[a-z][a-z0-9_.]{0,63}$"

DEFAULT_ON_ERROR = "fail"
DEFAULT_ON_DURATION = "pause"
DEFAULT_MAX_PARALLEL = 10
DEFAULT_JOIN = "all"
DEFAULT_TIMEOUT_S = 300
HUMAN_GATE_TIMEOUT_S = 86400
LOOP_TIMEOUT_S = 3600  # a loop step's default: every iteration together
DEFAULT_STRATEGY = "rules"
DEFAULT_MERGE = "list"
DEFAULT_REPAIR_ATTEMPTS = 1
DEFAULT_APPROVAL_AT = "medium"
DEFAULT_MIN_CONFIDENCE = 0.5
DEFAULT_ACTION_TIER = "low"
DEFAULT_OUTSIDE_TIER = "high"
# Human gates (docs/approvals.md). Not filled in by `normalize`: saved versions keep their
# digests; the approvals code reads each field with its default.
DEFAULT_GATE_TIER = "medium"
GATE_DEADLINE_CHOICES = ("expire", "reject")
DEFAULT_GATE_DEADLINE = "expire"
MAX_REQUIRED_APPROVALS = 10
MAX_ESCALATION_TIERS = 5
# A sleep step's `until` without an offset is read in this zone (filled in by `normalize`).
DEFAULT_SLEEP_TIMEZONE = "UTC"
# What a sleep step has of the common step fields: it runs nothing, so it has no attempt to
# time out or retry, and no model call to cap.
SLEEP_COMMON_FIELDS = ("name", "type", "description", "after", "when", "join", "fallback")
# A human_input step (docs/definitions.md#human_input): how long a person has to answer
# (filled in by `normalize`), and what happens when nobody did.
DEFAULT_INPUT_DEADLINE_S = 86400
INPUT_TIMEOUT_CHOICES = ("fail", "abstain")
DEFAULT_INPUT_TIMEOUT = "fail"
# A wait step (filled in by `normalize`): how long it waits, what its timeout does, and what a
# signal sent before it starts waiting does. It runs nothing, so it has no retry either.
WAIT_COMMON_FIELDS = SLEEP_COMMON_FIELDS
DEFAULT_WAIT_TIMEOUT_S = 86400
ON_TIMEOUT_CHOICES = ("fail", "continue")  # or the name of a step to route to
DEFAULT_ON_TIMEOUT = "fail"
EARLY_SIGNAL_CHOICES = ("buffer", "refuse")
DEFAULT_EARLY_SIGNALS = "buffer"
SIGNAL_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
RETRY_DEFAULTS: dict[str, Any] = {
    "max_attempts": 1,
    "backoff": "exponential",
    "base_s": 2,
    "max_s": 60,
    "jitter": True,
    "retry_on": ["timeout", "rate_limit", "transient"],
}

# The top-level `audit` section: per-workflow redaction for the audit ledger.
AUDIT_STORE_CHOICES = ("inline", "reference")
DEFAULT_AUDIT_STORE = "inline"
AUDIT_SENSITIVE_PATTERN = r"^(input|steps\.([a-z][a-z0-9_]{0,63}|\*)\.output)(\.[^.\s]+)*$"

# Names an expression or a template may start from. `item` and `index` exist only
# inside a map step's `item`.
CONTEXT_ROOTS = frozenset({"input", "steps"})
MAP_ITEM_ROOTS = frozenset({"item", "index"})
# `iteration` ({number, input, previous}) exists only inside a loop's body and its `until`.
LOOP_BODY_ROOTS = frozenset({"iteration"})
# A risk rule also reads the proposal it assesses.
RISK_RULE_ROOTS = CONTEXT_ROOTS | {"proposal"}


def default_timeout_s(step_type: str) -> int:
    if step_type == "loop":
        return LOOP_TIMEOUT_S
    return HUMAN_GATE_TIMEOUT_S if step_type == "human_gate" else DEFAULT_TIMEOUT_S


def definition_format_schema() -> dict:
    """Return the JSON Schema (draft 2020-12) of a workflow definition.

    A fresh deep copy on every call, so callers may mutate it.
    """
    return copy.deepcopy(shared_format_schema())


def step_type_schema_ref(step_type: str) -> str:
    return f"#/$defs/{step_type}_step"


# --- building blocks -------------------------------------------------------------------


def _ref(name: str) -> dict:
    return {"$ref": f"#/$defs/{name}"}


def _only_with(description: str) -> dict:
    # `not: {}` rejects any value; the description becomes the error message.
    return {"not": {}, "description": description}


_EXPRESSION = {
    "type": "string",
    "minLength": 1,
    "maxLength": limits.MAX_EXPRESSION_CHARS,
    "description": (
        "A CEL expression (https://github.com/google/cel-spec). Variables: `input` (the run "
        "input), `steps` (step name -> {output, state}); inside a map item also `item` and "
        "`index`. It may only read `steps.X` for steps X that are ancestors of this step."
    ),
}

_TEMPLATE = {
    "type": "string",
    "maxLength": limits.MAX_TEMPLATE_CHARS,
    "description": (
        "A Jinja2 template rendered in a sandbox with the same variables as expressions "
        "(`input`, `steps`, and in a map item `item`, `index`); an undefined variable is an error."
    ),
}

_JSON_SCHEMA = {
    "type": ["object", "boolean"],
    "description": "A JSON Schema (draft 2020-12).",
}

_STEP_REF = {"type": "string", "description": "The name of another step of this workflow."}

_SCRIPT = {
    "type": "array",
    "items": {"$ref": "#/$defs/scripted_reply"},
    "default": [],
    "description": (
        "Replies of the offline 'scripted' provider, tried in order; the first whose "
        "`when` holds (or that has none) is used."
    ),
}

_TIER = {"enum": list(RISK_TIERS), "description": "A risk tier: low < medium < high < critical."}

_NULLABLE_EXPRESSION = {
    **_EXPRESSION,
    "type": ["string", "null"],
    "description": "When present and false, the step is skipped (null: always run). "
    + _EXPRESSION["description"],
}


def _audit_schema() -> dict:
    return {
        "title": "audit",
        "type": "object",
        "additionalProperties": False,
        "description": "What the audit ledger may keep of this workflow's data (docs/audit.md).",
        "properties": {
            "sensitive": {
                "type": "array",
                "uniqueItems": True,
                "default": [],
                "items": {"type": "string", "pattern": AUDIT_SENSITIVE_PATTERN},
                "description": (
                    "Paths whose values the ledger stores only as a keyed hash and a masked "
                    "summary: `input.<field>...` or `steps.<step>.output...`; `*` matches any "
                    "one key or index."
                ),
            },
            "store_prompts": {
                "enum": list(AUDIT_STORE_CHOICES),
                "default": DEFAULT_AUDIT_STORE,
                "description": (
                    "inline: the ledger keeps redacted prompts, params, inputs and outputs. "
                    "reference: it keeps only where they live and their keyed hash."
                ),
            },
        },
    }


def _gate_properties() -> dict:
    """A human gate's approval policy (docs/approvals.md): what it binds, who decides, how
    many, by when. Every field is optional; the defaults are the ones documented there."""
    approvals_count = {"type": "integer", "minimum": 1, "maximum": MAX_REQUIRED_APPROVALS,
                       "description": "Distinct approvers required."}
    return {
        "approves": {
            **_STEP_REF,
            "description": (
                "The step whose action the approval binds: an upstream agent step with a "
                "`proposal`, or a tool step that runs after this gate. Default: the nearest "
                "upstream proposal, else the one tool step after the gate."
            ),
        },
        "risk_tier": {
            **_TIER,
            "description": (
                f"The tier of a gate that approves no proposal (default {DEFAULT_GATE_TIER}); a "
                "proposal's tier comes from its risk rules."
            ),
        },
        "required_approvals": {
            "description": (
                "How many distinct approvers must approve: a number, or one per tier "
                "({high: 2, critical: 3}; tiers not named need 1)."
            ),
            "oneOf": [
                approvals_count,
                {"type": "object", "additionalProperties": False,
                 "description": "Approvers required per risk tier.",
                 "properties": {tier: approvals_count for tier in RISK_TIERS}},
            ],
        },
        "self_approval_up_to": {
            **_TIER,
            "description": (
                "Up to this tier, whoever started the run or last edited the parameters may "
                "approve too. Default: never (separation of duties)."
            ),
        },
        "editable": {
            "type": "array",
            "uniqueItems": True,
            "items": {"type": "string", "minLength": 1},
            "description": "Parameters of the approved action a reviewer may change (default none).",
        },
        "escalation": {
            "type": "array",
            "maxItems": MAX_ESCALATION_TIERS,
            "description": (
                "Tiers the request moves to, in order, when the current one's deadline passes "
                "undecided."
            ),
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["approvers", "timeout_s"],
                "properties": {
                    "approvers": {"type": "string", "minLength": 1,
                                  "description": "The group that decides from then on."},
                    "timeout_s": {"type": "integer", "exclusiveMinimum": 0,
                                  "description": "Seconds this tier has to decide."},
                },
            },
        },
        "on_deadline": {
            "enum": list(GATE_DEADLINE_CHOICES),
            "description": (
                "When the last tier's deadline passes: expire (the gate times out; default) or "
                "reject (the request is rejected, the gate fails as rejected)."
            ),
        },
        "remind_before_s": {
            "type": "integer",
            "exclusiveMinimum": 0,
            "description": "Remind the deciding group this many seconds before each deadline.",
        },
        "mandatory": {
            "type": "boolean",
            "description": (
                "A gate a new version may not drop or weaken (approvers, approvals, condition, "
                "the steps it guards) unless an owner publishes it (docs/definitions.md)."
            ),
        },
        "guards": {
            "type": "array",
            "items": _STEP_REF,
            "uniqueItems": True,
            "minItems": 1,
            "description": "With mandatory: the high-risk steps that must wait for this gate.",
        },
    }


def _strategy_is(*strategies: str) -> dict:
    return {"properties": {"strategy": {"enum": list(strategies)}}, "required": ["strategy"]}


_no_llm = {
    field: _only_with(f"'{field}' is only used with strategy: llm")
    for field in ("model", "prompt", "system", "temperature", "script", "cache")
}

# Step kinds whose result may be reused (docs/definitions.md#cache): what they compute is
# decided by their definition and input, and a worker computes it. A router only with
# strategy: llm (the others evaluate an expression, nothing worth keeping).
CACHEABLE_TYPES = ("agent", "tool", "router")


def _cache_schema() -> dict:
    return {
        "title": "cache",
        "type": "object",
        "required": ["key", "ttl_s"],
        "additionalProperties": False,
        "description": (
            "Reuse this step's output: a run whose rendered key and whose step (prompt, model "
            "and provider, output schema, tool and its version, the step's definition) are the "
            "same as an earlier run's of the same team, within ttl_s, copies that output "
            "instead of calling the model or the tool. Never for a step with side effects."
        ),
        "properties": {
            "key": {
                **_TEMPLATE,
                "minLength": 1,
                "description": (
                    "What makes two runs' inputs the same for this step, e.g. "
                    "'{{ input.ticket_id }}'. " + _TEMPLATE["description"]
                ),
            },
            "ttl_s": {
                "type": "integer",
                "exclusiveMinimum": 0,
                "maximum": limits.MAX_CACHE_TTL_S,
                "description": "Seconds a stored output may be reused after it was produced.",
            },
        },
    }


def _no_cache(kind: str, why: str) -> dict:
    return {"cache": _only_with(f"a {kind} step's result is never reused: {why}")}


def _retry_schema() -> dict:
    return {
        "title": "retry policy",
        "type": "object",
        "description": "How a failed attempt is retried before the step fails.",
        "additionalProperties": False,
        "properties": {
            "max_attempts": {
                "type": "integer",
                "minimum": 1,
                "maximum": limits.MAX_RETRY_ATTEMPTS,
                "default": RETRY_DEFAULTS["max_attempts"],
                "description": "Total attempts, including the first.",
            },
            "backoff": {
                "enum": list(BACKOFF_CHOICES),
                "default": RETRY_DEFAULTS["backoff"],
                "description": "How the delay grows between attempts.",
            },
            "base_s": {
                "type": "number",
                "minimum": 0,
                "maximum": limits.MAX_RETRY_DELAY_S,
                "default": RETRY_DEFAULTS["base_s"],
                "description": "Delay before the first retry, in seconds.",
            },
            "max_s": {
                "type": "number",
                "minimum": 0,
                "maximum": limits.MAX_RETRY_DELAY_S,
                "default": RETRY_DEFAULTS["max_s"],
                "description": "Upper bound of any delay, in seconds.",
            },
            "jitter": {
                "type": "boolean",
                "default": RETRY_DEFAULTS["jitter"],
                "description": "Randomise each delay to spread retries out.",
            },
            "retry_on": {
                "type": "array",
                "items": {"enum": list(RETRYABLE_ERRORS)},
                "uniqueItems": True,
                "default": list(RETRY_DEFAULTS["retry_on"]),
                "description": "Failure classes that are retried; any other failure is final.",
            },
        },
    }


def _common_step_properties() -> dict:
    return {
        "name": {
            "type": "string",
            "pattern": STEP_NAME_PATTERN,
            "description": "Unique within the workflow: a lowercase letter, then up to 63 of a-z, 0-9, _.",
        },
        "type": {"enum": list(STEP_TYPES), "description": "What the step does."},
        "description": {"type": "string", "default": "", "description": "Free text for people."},
        "after": {
            "type": "array",
            "items": _STEP_REF,
            "default": [],
            "description": "Steps that must finish before this one starts.",
        },
        "when": _NULLABLE_EXPRESSION,
        "join": {
            "enum": list(JOIN_CHOICES),
            "default": DEFAULT_JOIN,
            "description": (
                "all: a skipped dependency skips this step. any: the step runs if at least "
                "one dependency completed."
            ),
        },
        "timeout_s": {
            "type": "integer",
            "exclusiveMinimum": 0,
            "maximum": limits.MAX_TIMEOUT_S,
            "description": (
                f"Seconds an attempt may take (default {DEFAULT_TIMEOUT_S}; "
                f"{HUMAN_GATE_TIMEOUT_S} for human_gate; {LOOP_TIMEOUT_S} for a loop, "
                "all its iterations together)."
            ),
        },
        "retry": _ref("retry"),
        "max_cost_usd": {
            "type": ["number", "null"],
            "minimum": 0,
            "maximum": limits.MAX_COST_USD,
            "description": (
                "USD this step's model calls may cost, across its attempts (a map: its items). "
                "A dispatch that would exceed it pauses the run (null: no limit)."
            ),
        },
        "fallback": {
            "type": ["string", "null"],
            "description": (
                "A step to run if this one fails after its retries; it must not be an "
                "ancestor of this step, nor wait for it, nor be the fallback of another step."
            ),
        },
        "input_schema": {
            **_JSON_SCHEMA,
            "description": (
                "A JSON Schema of type object whose properties are names of ancestor steps, "
                "each the schema this step requires of that step's output. Checked against "
                "the producers' output_schema when the definition is saved."
            ),
        },
        "output_schema": {**_JSON_SCHEMA, "description": "JSON Schema of this step's output."},
    }


def _without(name: str, properties: dict) -> dict:
    return {key: value for key, value in properties.items() if key != name}


def _step_concurrency() -> dict:
    return {
        "title": "step concurrency",
        "type": "object",
        "additionalProperties": False,
        "required": ["key", "limit"],
        "description": "At most `limit` steps of this name per key run at once across the "
                       "workflow's runs (one refund per customer at a time): the others wait "
                       "`queued`, in order, until one of them ends.",
        "properties": {
            "key": {"type": "string", "minLength": 1, "maxLength": 1000,
                    "description": "A template over the run's input, e.g. "
                                   "\"{{ input.customer_id }}\"."},
            "limit": {"type": "integer", "minimum": 1, "maximum": limits.MAX_CONCURRENCY_LIMIT,
                      "description": "How many steps of one key may run at once."},
        },
    }


def _agent_properties() -> dict:
    return {
        "model": {"type": "string", "description": "A registered model name."},
        "prompt": {**_TEMPLATE, "description": "The user prompt. " + _TEMPLATE["description"]},
        "system": {**_TEMPLATE, "description": "The system prompt. " + _TEMPLATE["description"]},
        "temperature": {
            "type": "number",
            "minimum": 0,
            "maximum": limits.MAX_TEMPERATURE,
            "description": "Sampling temperature.",
        },
        "max_tokens": {
            "type": "integer",
            "exclusiveMinimum": 0,
            "maximum": limits.MAX_TOKENS,
            "description": "Upper bound on output tokens.",
        },
        "script": _SCRIPT,
        "cache": _ref("cache"),
        "concurrency": _step_concurrency(),
        "repair_attempts": {
            "type": "integer",
            "minimum": 0,
            "maximum": limits.MAX_REPAIR_ATTEMPTS,
            "default": DEFAULT_REPAIR_ATTEMPTS,
            "description": (
                "How many times, within one attempt, a reply that fails validation is sent "
                "back to the model with the problems listed. Their tokens count against the "
                "budget; after the last one the attempt fails as invalid_output."
            ),
        },
    }


def _tool_properties() -> dict:
    return {
        "tool": {"type": "string", "description": "A registered tool name."},
        "params": {
            "type": "object",
            "default": {},
            "description": (
                "Tool parameters; every string is a template. Without templates they are "
                "validated against the tool's params schema when the definition is saved."
            ),
        },
        "side_effect": {
            "type": "boolean",
            "default": False,
            "description": "The tool changes the world; it runs at most once per idempotency key.",
        },
        "compensate": _ref("compensation"),
        "cache": _ref("cache"),
        "concurrency": _step_concurrency(),
    }


def _route(required: list[str], step_ref_list: dict, *, when: dict, minimum: dict,
           name: str = "Unique within the router.", description: dict | None = None) -> dict:
    """A router's route as each strategy has it: what differs is which of `when`, `min` and
    `description` it needs."""
    return {
        "title": "route",
        "type": "object",
        "required": required,
        "additionalProperties": False,
        "properties": {
            "name": {"type": "string", "minLength": 1, "description": name},
            "description": description or {
                "type": "string",
                "description": "What this route is for (shown to the model with strategy: llm).",
            },
            "when": when,
            "min": minimum,
            "then": {**step_ref_list, "description": "Steps that run if this route is taken."},
        },
    }


def _closed_step(title: str, properties: dict, required: list[str]) -> dict:
    return {
        "title": title,
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _map_item_properties() -> dict:
    common = _common_step_properties()
    kept = ("type", "description", "timeout_s", "retry", "input_schema", "output_schema")
    properties = {key: common[key] for key in kept}
    properties["type"] = {"enum": list(MAP_ITEM_TYPES), "description": "What each item runs."}
    return properties


@cache
def shared_format_schema() -> dict:
    """The format schema, built once and shared: callers must not mutate it."""
    common = _common_step_properties()
    agent = _agent_properties()
    tool = _tool_properties()
    item_base = _map_item_properties()
    step_ref_list = {"type": "array", "items": _STEP_REF}

    defs: dict[str, Any] = {
        "expression": _EXPRESSION,
        "template": _TEMPLATE,
        "retry": _retry_schema(),
        "cache": _cache_schema(),
        "compensation": {
            "title": "compensation",
            "type": "object",
            "description": "A tool call that undoes this step's side effect, run when the run is rolled back.",
            "required": ["tool"],
            "additionalProperties": False,
            "properties": {
                "tool": {"type": "string", "description": "A registered tool name."},
                "params": {"type": "object", "default": {}, "description": "Templated parameters."},
                "retry": {
                    **_ref("retry"),
                    "description": (
                        "How a failed compensation is retried before the run is left "
                        "compensation_failed; defaults to the step's own retry policy."
                    ),
                },
            },
        },
        "scripted_reply": {
            "title": "scripted reply",
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "when": {
                    **_EXPRESSION,
                    "description": "Use this reply only if it holds. " + _EXPRESSION["description"],
                },
                "output": {
                    "description": "The reply; must match the step's output_schema unless `error` is set."
                },
                "tokens_in": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": limits.MAX_SCRIPTED_TOKENS,
                    "description": "Reported input tokens.",
                },
                "tokens_out": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": limits.MAX_SCRIPTED_TOKENS,
                    "description": "Reported output tokens.",
                },
                "delay_ms": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": limits.MAX_SCRIPTED_DELAY_MS,
                    "description": "Simulated latency.",
                },
                "error": {
                    "enum": list(SCRIPTED_ERRORS),
                    "description": "Fail the attempt with this class instead of replying.",
                },
            },
            # `output` is required unless the reply is a scripted failure.
            "if": {"required": ["error"]},
            "else": {"required": ["output"]},
        },
        "rules_route": _route(
            ["name", "when", "then"], step_ref_list,
            when={
                **_EXPRESSION,
                "description": "The first route whose expression holds is taken. "
                + _EXPRESSION["description"],
            },
            minimum=_only_with("'min' is only used with strategy: score"),
        ),
        "score_route": _route(
            ["name", "min", "then"], step_ref_list,
            when=_only_with("'when' on a route is only used with strategy: rules"),
            minimum={
                "type": "number",
                "description": "Taken when the score is >= min; the route with the highest matching min wins.",
            },
        ),
        "llm_route": _route(
            ["name", "description", "then"], step_ref_list,
            name="Unique within the router; the model answers with it.",
            description={
                "type": "string",
                "minLength": 1,
                "description": "What this route is for; shown to the model.",
            },
            when=_only_with("'when' on a route is only used with strategy: rules"),
            minimum=_only_with("'min' is only used with strategy: score"),
        ),
        "proposal": {
            "title": "proposal",
            "type": "object",
            "required": ["actions"],
            "additionalProperties": False,
            "description": (
                "The step proposes one action from this allowlist instead of free output: "
                "{action_type, params, evidence, rationale, confidence}. Its output is "
                "{proposal, proposal_hash, risk}; the risk block is computed by Stepwise."
            ),
            "properties": {
                "actions": {
                    "type": "array",
                    "minItems": 1,
                    "items": _ref("action"),
                    "description": "The allowlist: the only action types the model may propose.",
                },
                "approval_at": {
                    **_TIER,
                    "default": DEFAULT_APPROVAL_AT,
                    "description": (
                        "risk.requires_approval is true from this tier up (critical always)."
                    ),
                },
                "min_confidence": {
                    "type": "number",
                    "minimum": 0,
                    "maximum": 1,
                    "default": DEFAULT_MIN_CONFIDENCE,
                    "description": "A proposal the model is less confident of is at least high risk.",
                },
            },
        },
        "action": {
            "title": "action",
            "type": "object",
            "required": ["type", "params_schema"],
            "additionalProperties": False,
            "properties": {
                "type": {
                    "type": "string",
                    "pattern": ACTION_TYPE_PATTERN,
                    "description": "The action_type the model may propose; unique in the allowlist.",
                },
                "description": {
                    "type": "string",
                    "default": "",
                    "description": "What the action does; shown to the model.",
                },
                "params_schema": {
                    **_JSON_SCHEMA,
                    "type": "object",
                    "description": (
                        "JSON Schema (type object) of the action's params; params it does not "
                        "list are rejected."
                    ),
                },
                "risk": _ref("action_risk"),
            },
        },
        "action_risk": {
            "title": "action risk",
            "type": "object",
            "additionalProperties": False,
            "description": "Deterministic rules giving a proposal of this action its risk tier.",
            "properties": {
                "tier": {
                    **_TIER,
                    "default": DEFAULT_ACTION_TIER,
                    "description": "The tier of the action type itself.",
                },
                "amount": {
                    "title": "amount rule",
                    "type": "object",
                    "required": ["param"],
                    "additionalProperties": False,
                    "description": "A numeric param: reaching a threshold raises the tier.",
                    "properties": {
                        "param": {"type": "string", "description": "The param holding the amount."},
                        "medium": {"type": "number", "description": "At least medium from here."},
                        "high": {"type": "number", "description": "At least high from here."},
                        "critical": {"type": "number", "description": "Critical from here."},
                    },
                },
                "recipient": {
                    "title": "recipient rule",
                    "type": "object",
                    "required": ["param", "allowed"],
                    "additionalProperties": False,
                    "description": "A param naming who is affected: outside `allowed` raises the tier.",
                    "properties": {
                        "param": {
                            "type": "string",
                            "description": "The param holding a recipient (or a list of them).",
                        },
                        "allowed": {
                            "type": "array",
                            "items": {"type": "string", "minLength": 1},
                            "description": (
                                "Exact values, or domains: an email address whose domain, or "
                                "a URL whose host, is listed is in scope."
                            ),
                        },
                        "outside": {
                            **_TIER,
                            "default": DEFAULT_OUTSIDE_TIER,
                            "description": "The tier of a recipient outside `allowed`.",
                        },
                    },
                },
                "rules": {
                    "type": "array",
                    "default": [],
                    "description": "Further rules; each that holds raises the tier.",
                    "items": {
                        "title": "risk rule",
                        "type": "object",
                        "required": ["when", "tier"],
                        "additionalProperties": False,
                        "properties": {
                            "when": {
                                **_EXPRESSION,
                                "description": (
                                    "CEL over `input`, `steps` and `proposal`; when it holds "
                                    "the tier is at least `tier` (an error counts as critical)."
                                ),
                            },
                            "tier": _TIER,
                            "reason": {"type": "string", "description": "Shown to approvers."},
                        },
                    },
                },
            },
        },
        "default_route": {
            "title": "default route",
            "type": "object",
            "required": ["name", "then"],
            "additionalProperties": False,
            "properties": {
                "name": {
                    "type": "string",
                    "minLength": 1,
                    "description": "Distinct from the route names.",
                },
                "description": {
                    "type": "string",
                    "description": "What the default is for (shown to the model with strategy: llm).",
                },
                "then": {**step_ref_list, "description": "Steps that run if no route is taken."},
            },
        },
        "agent_step": {
            **_closed_step(
                "agent step",
                {
                    **common,
                    **agent,
                    "proposal": _ref("proposal"),
                },
                ["name", "type", "model", "prompt"],
            ),
            # A proposing step's output schema is derived from its allowlist.
            "if": {"required": ["proposal"]},
            "then": {
                "properties": {
                    "output_schema": _only_with(
                        "a step with `proposal` has its output schema derived from the actions"
                    )
                }
            },
            "else": {"required": ["output_schema"]},
        },
        "tool_step": _closed_step("tool step", {**common, **tool}, ["name", "type", "tool"]),
        "router_step": {
            **_closed_step(
                "router step",
                {
                    **common,
                    "strategy": {
                        "enum": list(ROUTER_STRATEGIES),
                        "default": DEFAULT_STRATEGY,
                        "description": (
                            "rules: first route whose `when` holds. score: evaluate `score`, "
                            "take the route with the highest `min` <= score. llm: a model picks "
                            "a route by name from their descriptions; any other answer takes "
                            "the default."
                        ),
                    },
                    "routes": {"type": "array", "minItems": 1, "description": "The branches."},
                    "default": _ref("default_route"),
                    "score": {
                        **_EXPRESSION,
                        "description": "A number (strategy: score). " + _EXPRESSION["description"],
                    },
                    "model": {
                        "type": "string",
                        "description": "A registered model name (strategy: llm).",
                    },
                    "prompt": {
                        **_TEMPLATE,
                        "description": "What to route (strategy: llm). " + _TEMPLATE["description"],
                    },
                    "system": {
                        **_TEMPLATE,
                        "description": "The system prompt (strategy: llm). "
                        + _TEMPLATE["description"],
                    },
                    "temperature": {
                        "type": "number",
                        "minimum": 0,
                        "maximum": limits.MAX_TEMPERATURE,
                        "description": "Sampling temperature (strategy: llm).",
                    },
                    "script": {**_SCRIPT, "description": "Scripted answers (strategy: llm). "
                               + _SCRIPT["description"]},
                    "cache": {**_ref("cache"), "description": "Reuse the route the model chose "
                              "(strategy: llm)."},
                },
                ["name", "type", "routes", "default"],
            ),
            "allOf": [
                {
                    "if": _strategy_is("score"),
                    "then": {
                        "required": ["score"],
                        "properties": {"routes": {"items": _ref("score_route")}, **_no_llm},
                    },
                },
                {
                    "if": _strategy_is("llm"),
                    "then": {
                        "required": ["model", "prompt"],
                        "properties": {
                            "routes": {"items": _ref("llm_route")},
                            "score": _only_with("'score' is only used with strategy: score"),
                        },
                    },
                },
                {
                    "if": {"not": _strategy_is("score", "llm")},
                    "then": {
                        "properties": {
                            "routes": {"items": _ref("rules_route")},
                            "score": _only_with("'score' is only used with strategy: score"),
                            **_no_llm,
                        }
                    },
                },
            ],
        },
        "map_step": _closed_step(
            "map step",
            {
                **common,
                "over": {
                    **_EXPRESSION,
                    "description": "A list; one item run per element. "
                    + _EXPRESSION["description"],
                },
                "item": _ref("map_item"),
                "merge": {
                    "enum": list(MERGE_STRATEGIES),
                    "default": DEFAULT_MERGE,
                    "description": "list: outputs in item order. dict_merge: outputs (objects) merged in order. first_success: the first item that succeeded.",
                },
                **_no_cache("map", "its items are runs of their own, each with its input"),
            },
            ["name", "type", "over", "item"],
        ),
        "map_item": {
            "title": "map item",
            "type": "object",
            "required": ["type"],
            "description": "What runs for each element: an agent or tool step body without name/after/when/join/fallback.",
            "properties": {"type": item_base["type"]},
            "allOf": [
                {
                    "if": {"properties": {"type": {"const": "agent"}}, "required": ["type"]},
                    "then": _closed_step(
                        "agent map item",
                        _without("concurrency", {**item_base, **agent, **_no_cache("map item", "items are not steps")}),
                        ["type", "model", "prompt", "output_schema"],
                    ),
                },
                {
                    "if": {"properties": {"type": {"const": "tool"}}, "required": ["type"]},
                    "then": _closed_step("tool map item",
                                         _without("concurrency", {**item_base, **tool, **_no_cache("map item", "items are not steps")}),
                                         ["type", "tool"]),
                },
            ],
        },
        "human_gate_step": _closed_step(
            "human_gate step",
            {
                **common,
                "approvers": {
                    "type": "string",
                    "minLength": 1,
                    "description": "The group whose members may approve.",
                },
                "instructions": {
                    **_TEMPLATE,
                    "description": "Shown to approvers. " + _TEMPLATE["description"],
                },
                **_gate_properties(),
                **_no_cache("human_gate", "a person decides it, each time"),
            },
            ["name", "type", "approvers"],
        ),
        "sub_workflow_step": _closed_step(
            "sub_workflow step",
            {
                **common,
                "workflow": {
                    "type": "string",
                    "description": "The name of a saved workflow; its latest version runs.",
                },
                "input": {
                    "type": "object",
                    "default": {},
                    "description": "The child run's input; every string is a template.",
                },
                **_no_cache("sub_workflow", "its child run is a run of its own, with its own steps' caches"),
            },
            ["name", "type", "workflow"],
        ),
        "sleep_step": _closed_step(
            "sleep step",
            {
                **{key: common[key] for key in SLEEP_COMMON_FIELDS},
                "for_s": {
                    "type": "integer",
                    "exclusiveMinimum": 0,
                    "maximum": limits.MAX_SLEEP_S,
                    "description": "Seconds to wait from when the step starts (or `until`).",
                },
                "until": {
                    **_TEMPLATE,
                    "minLength": 1,
                    "description": (
                        "The time to wait until (or `for_s`): ISO 8601, e.g. "
                        "'2026-12-24T18:00:00', rendered when the step starts; a time in the "
                        "past wakes at once. " + _TEMPLATE["description"]
                    ),
                },
                "timezone": {
                    "type": "string",
                    "minLength": 1,
                    "description": (
                        f"The IANA time zone of an `until` without an offset (default "
                        f"{DEFAULT_SLEEP_TIMEZONE}); only with `until`."
                    ),
                },
                **_no_cache("sleep", "it waits for a time and computes nothing"),
            },
            ["name", "type"],
        ),
        "human_input_step": _closed_step(
            "human_input step",
            {
                **{key: common[key] for key in SLEEP_COMMON_FIELDS},
                "group": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 150,
                    "description": "The group whose members (in the run's team) answer.",
                },
                "assignee": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 150,
                    "description": (
                        "The username of the one person who answers (a member of the run's "
                        "team); until an escalation, no one else of the group may."
                    ),
                },
                "instructions": {
                    **_TEMPLATE,
                    "description": "Shown above the form. " + _TEMPLATE["description"],
                },
                "evidence": {
                    "type": "object",
                    "maxProperties": 50,
                    "additionalProperties": {**_TEMPLATE, "minLength": 1},
                    "description": (
                        "What the person is shown to answer by: a label -> a template over the "
                        "run, rendered when the step starts."
                    ),
                },
                "form": {
                    **_JSON_SCHEMA,
                    "description": (
                        "A JSON Schema of type object whose properties are the form's fields "
                        "(string, with or without enum, number, integer, boolean); `required` "
                        "fields must be filled in. The answer is checked against it."
                    ),
                },
                "deadline_s": {
                    "type": "integer",
                    "exclusiveMinimum": 0,
                    "maximum": limits.MAX_TIMEOUT_S,
                    "description": (
                        f"Seconds the person has to answer (default {DEFAULT_INPUT_DEADLINE_S}); "
                        "then on_timeout applies."
                    ),
                },
                "escalate_to": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 150,
                    "description": (
                        "A group that takes the task over, once, when it is unanswered after "
                        "escalate_after_s (with escalate_after_s)."
                    ),
                },
                "escalate_after_s": {
                    "type": "integer",
                    "exclusiveMinimum": 0,
                    "maximum": limits.MAX_TIMEOUT_S,
                    "description": "Seconds after the start to escalate (less than deadline_s).",
                },
                "on_timeout": {
                    "enum": list(INPUT_TIMEOUT_CHOICES),
                    "default": DEFAULT_INPUT_TIMEOUT,
                    "description": (
                        "fail: the step times out and the workflow's on_error applies. abstain: "
                        "the step completes as an abstention, which the definition routes on."
                    ),
                },
                "allow_abstain": {
                    "type": "boolean",
                    "default": False,
                    "description": "Whether the person may answer 'can't decide' (abstain).",
                },
                "separation_of_duties": {
                    "type": "boolean",
                    "default": False,
                    "description": (
                        "Whether whoever set the run in motion is barred from answering."
                    ),
                },
                **_no_cache("human_input", "a person answers it, each time"),
            },
            ["name", "type", "group", "form"],
        ),
        "wait_step": _closed_step(
            "wait step",
            {
                **{key: common[key] for key in WAIT_COMMON_FIELDS},
                "signal": {
                    "type": "string",
                    "pattern": SIGNAL_NAME_PATTERN,
                    "description": (
                        "The name of the signal it waits for (POST /api/v1/runs/<id>/signals/"
                        "<name>/, or a trigger's correlated event); its payload is the step's "
                        "output."
                    ),
                },
                "schema": {
                    **_JSON_SCHEMA,
                    "description": "JSON Schema the signal's payload must satisfy (draft 2020-12).",
                },
                "correlation_key": {
                    **_TEMPLATE,
                    "minLength": 1,
                    "description": (
                        "Rendered when the step starts: a trigger's event whose `correlate` "
                        "gives this key is delivered to this step as its signal. "
                        + _TEMPLATE["description"]
                    ),
                },
                "timeout_s": {
                    "type": "integer",
                    "exclusiveMinimum": 0,
                    "maximum": limits.MAX_WAIT_S,
                    "description": (
                        f"Seconds it waits for the signal (default {DEFAULT_WAIT_TIMEOUT_S})."
                    ),
                },
                "on_timeout": {
                    "type": "string",
                    "minLength": 1,
                    "description": (
                        "fail: the step times out (class `timeout`); continue: it completes "
                        "with {\"timed_out\": true}; or the name of a step after it, which runs "
                        "instead of the steps that wait for the signal (default "
                        f"{DEFAULT_ON_TIMEOUT})."
                    ),
                },
                "early_signals": {
                    "enum": list(EARLY_SIGNAL_CHOICES),
                    "description": (
                        "A signal sent while the step has not started waiting: buffer (kept, "
                        f"at most {limits.MAX_BUFFERED_SIGNALS} per run, and consumed when it "
                        f"starts) or refuse (409) (default {DEFAULT_EARLY_SIGNALS})."
                    ),
                },
                **_no_cache("wait", "its output is the signal it receives"),
            },
            ["name", "type", "signal"],
        ),
        "loop_step": _closed_step(
            "loop step",
            {
                **common,
                "body": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": limits.MAX_LOOP_BODY_STEPS,
                    "items": {
                        "allOf": [_ref("step")],
                        "properties": {
                            "type": {
                                "enum": list(LOOP_BODY_TYPES),
                                "description": "A loop's body holds agent, tool and router steps.",
                            }
                        },
                    },
                    "description": (
                        "The steps of one iteration, a small DAG of their own: `after` names "
                        "body steps only. Iteration N of body step X is the step run `X[N]`."
                    ),
                },
                "until": {
                    **_EXPRESSION,
                    "description": (
                        "Checked after each iteration; when it holds the loop completes. It reads "
                        "`input`, `steps` (this iteration's body steps only) and `iteration` "
                        "({number, input, previous})."
                    ),
                },
                "max_iterations": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": limits.MAX_LOOP_ITERATIONS,
                    "description": (
                        "The bound: after this many iterations without `until` holding, the "
                        "loop step fails with class loop_exhausted."
                    ),
                },
                "input": {
                    "type": "object",
                    "default": {},
                    "description": (
                        "Rendered once when the loop starts, from its upstream steps; the body "
                        "reads it as `iteration.input`. Every string is a template."
                    ),
                },
                **_no_cache("loop", "its iterations run its body steps, each decided anew"),
            },
            ["name", "type", "body", "until", "max_iterations"],
        ),
        "step": {
            "title": "step",
            "type": "object",
            "required": ["name", "type"],
            "properties": {"name": common["name"], "type": common["type"]},
            "allOf": [
                {
                    "if": {"properties": {"type": {"const": step_type}}, "required": ["type"]},
                    "then": {"$ref": step_type_schema_ref(step_type)},
                }
                for step_type in STEP_TYPES
            ],
        },
    }

    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "Stepwise workflow definition",
        "description": "A workflow: a DAG of steps run durably by Stepwise. YAML or JSON.",
        "type": "object",
        "required": ["name", "input_schema", "steps"],
        "additionalProperties": False,
        "properties": {
            "name": {
                "type": "string",
                "pattern": WORKFLOW_NAME_PATTERN,
                "description": "A lowercase letter, then up to 99 of a-z, 0-9, _, -.",
            },
            "description": {
                "type": "string",
                "default": "",
                "description": "Free text for people.",
            },
            "input_schema": {
                **_JSON_SCHEMA,
                "description": "JSON Schema every run input must satisfy.",
            },
            "budget": {
                "title": "budget",
                "type": "object",
                "additionalProperties": False,
                "description": "Limits for one run; dispatch stops before a step would exceed them.",
                "properties": {
                    "max_cost_usd": {
                        "type": ["number", "null"],
                        "minimum": 0,
                        "maximum": limits.MAX_COST_USD,
                        "description": "Total model and tool cost (null: no limit).",
                    },
                    "max_duration_s": {
                        "type": ["integer", "null"],
                        "exclusiveMinimum": 0,
                        "maximum": limits.MAX_RUN_DURATION_S,
                        "description": "Wall-clock seconds (null: no limit).",
                    },
                    "on_duration": {
                        "enum": list(ON_DURATION_CHOICES),
                        "default": DEFAULT_ON_DURATION,
                        "description": "A run past max_duration_s: pause it (its running steps "
                                       "are stopped and run again once an operator raises the "
                                       "limit and resumes it) or fail it (timed_out).",
                    },
                },
            },
            "on_error": {
                "enum": list(ON_ERROR_CHOICES),
                "default": DEFAULT_ON_ERROR,
                "description": "When a step fails for good: fail the run, pause it for an operator, or continue with the steps that do not depend on it.",
            },
            "max_parallel": {
                "type": "integer",
                "minimum": 1,
                "maximum": limits.MAX_PARALLEL,
                "default": DEFAULT_MAX_PARALLEL,
                "description": "At most this many steps of one run run at once.",
            },
            "capacity": {
                "type": "string",
                "pattern": "^[a-z][a-z0-9_]{0,15}$",
                "description": "The capacity class its runs go to unless a start or trigger "
                               "names another: interactive (default), batch, evaluation or "
                               "one the deployment adds (docs/operations.md#capacity).",
            },
            "concurrency": {
                "title": "concurrency",
                "type": "object",
                "additionalProperties": False,
                "required": ["key", "limit"],
                "description": "At most `limit` unfinished runs of this workflow per key (one "
                               "refund per customer at a time): a run whose key has as many "
                               "going is held, in order, until one of them ends.",
                "properties": {
                    "key": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": 1000,
                        "description": "A template over the run's input, e.g. "
                                       "\"{{ input.customer_id }}\".",
                    },
                    "limit": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": limits.MAX_CONCURRENCY_LIMIT,
                        "description": "How many runs of one key may be unfinished at once.",
                    },
                },
            },
            "audit": _audit_schema(),
            "steps": {
                "type": "array",
                "minItems": 1,
                "maxItems": limits.MAX_STEPS,
                "items": _ref("step"),
                "description": "The steps, in any order; `after` orders them.",
            },
        },
        "$defs": defs,
    }
