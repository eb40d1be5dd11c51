"""Every validation rule has at least one failing case, table-driven.

Each case edits a valid example (the support workflow, or the routing workflow with a
router, a map step and a sub-workflow) and names the problem it must produce.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import pytest

DELETE = object()


@dataclass(frozen=True)
class Case:
    id: str
    edit: Callable[[dict], None]
    path: str
    fragments: tuple[str, ...]
    example: str = "support"


def put(*changes: tuple[tuple, object]) -> Callable[[dict], None]:
    """An edit setting (or with DELETE removing) the value at each path."""

    def edit(doc: dict) -> None:
        for path, value in changes:
            node = doc
            for part in path[:-1]:
                node = node[part]
            if value is DELETE:
                del node[path[-1]]
            else:
                node[path[-1]] = value

    return edit


def case(id, edit, path, *fragments, example="support"):
    return pytest.param(Case(id, edit, path, fragments, example), id=id)


STRUCTURE = [
    case("missing-name", put((("name",), DELETE)), "", "missing required field 'name'"),
    case("missing-steps", put((("steps",), DELETE)), "", "missing required field 'steps'"),
    case("missing-input-schema", put((("input_schema",), DELETE)), "", "'input_schema'"),
    case("empty-steps", put((("steps",), [])), "steps", "must not be empty"),
    case("bad-workflow-name", put((("name",), "Support Reply")), "name", "not a valid name"),
    case("extra-top-field", put((("owner",), "me")), "owner", "unknown field 'owner'"),
    case(
        "extra-budget-field",
        put((("budget", "max_tokens"), 3)),
        "budget.max_tokens",
        "unknown field",
    ),
    case("negative-budget", put((("budget", "max_cost_usd"), -1)), "budget.max_cost_usd", ">= 0"),
    case("zero-duration", put((("budget", "max_duration_s"), 0)), "budget.max_duration_s", "> 0"),
    case("bad-on-duration", put((("budget", "on_duration"), "cancel")), "budget.on_duration", "pause, fail"),
    case("bad-on-error", put((("on_error",), "explode")), "on_error", "fail, pause, continue"),
    case("zero-max-parallel", put((("max_parallel",), 0)), "max_parallel", ">= 1"),
    case("step-not-mapping", put((("steps", 1), "research")), "steps[1]", "must be a mapping"),
    case(
        "missing-model",
        put((("steps", 0, "model"), DELETE)),
        "steps[0]",
        "missing required field 'model'",
    ),
    case(
        "agent-needs-output-schema",
        put((("steps", 0, "output_schema"), DELETE)),
        "steps[0]",
        "'output_schema'",
    ),
    case(
        "missing-step-type",
        put((("steps", 0, "type"), DELETE)),
        "steps[0]",
        "missing required field 'type'",
    ),
    case(
        "unknown-step-type",
        put((("steps", 0, "type"), "llm")),
        "steps[0].type",
        "unknown step type 'llm'",
        "agent, tool, router, map, human_gate, sub_workflow",
    ),
    case(
        "field-of-other-type",
        put((("steps", 2, "model"), "fast")),
        "steps[2].model",
        "unknown field 'model' in a tool step",
    ),
    case(
        "side-effect-on-agent",
        put((("steps", 0, "side_effect"), True)),
        "steps[0].side_effect",
        "unknown field 'side_effect'",
    ),
    case(
        "unknown-step-field",
        put((("steps", 4, "approver"), "x")),
        "steps[4].approver",
        "unknown field 'approver' in a human_gate step",
    ),
    case(
        "bad-step-name",
        put((("steps", 5, "name"), "Send-Email")),
        "steps[5].name",
        "not a valid name",
    ),
    case("zero-timeout", put((("steps", 0, "timeout_s"), 0)), "steps[0].timeout_s", "> 0"),
    case(
        "string-timeout",
        put((("steps", 0, "timeout_s"), "30")),
        "steps[0].timeout_s",
        "must be an integer, not a string",
    ),
    case(
        "bad-backoff",
        put((("steps", 1, "retry", "backoff"), "random")),
        "steps[1].retry.backoff",
        "exponential, linear, fixed",
    ),
    case(
        "bad-retry-on",
        put((("steps", 1, "retry", "retry_on"), ["auth"])),
        "steps[1].retry.retry_on[0]",
        "'auth'",
    ),
    case(
        "zero-attempts",
        put((("steps", 1, "retry", "max_attempts"), 0)),
        "steps[1].retry.max_attempts",
        ">= 1",
    ),
    case(
        "retry-cap-below-base",
        put((("steps", 1, "retry", "max_s"), 0.5)),
        "steps[1].retry.max_s",
        "must be >= base_s",
    ),
    case(
        "unknown-retry-field",
        put((("steps", 1, "retry", "tries"), 2)),
        "steps[1].retry.tries",
        "unknown field 'tries' in a retry policy",
    ),
    case("bad-join", put((("steps", 3, "join"), "some")), "steps[3].join", "all, any"),
    case(
        "after-not-list",
        put((("steps", 1, "after"), "classify")),
        "steps[1].after",
        "must be a list",
    ),
    case(
        "when-boolean",
        put((("steps", 1, "when"), False)),
        "steps[1].when",
        "must be a string or null, not a boolean",
    ),
    case(
        "params-not-mapping",
        put((("steps", 2, "params"), ["x"])),
        "steps[2].params",
        "must be a mapping",
    ),
    case("missing-approvers", put((("steps", 4, "approvers"), DELETE)), "steps[4]", "'approvers'"),
    case(
        "compensate-without-tool",
        put((("steps", 5, "compensate", "tool"), DELETE)),
        "steps[5].compensate",
        "'tool'",
    ),
    case(
        "script-reply-without-output",
        put((("steps", 0, "script", 1), {"tokens_in": 3})),
        "steps[0].script[1]",
        "missing required field 'output'",
    ),
    case(
        "script-unknown-error",
        put((("steps", 0, "script", 1), {"error": "boom"})),
        "steps[0].script[1].error",
        "'boom'",
    ),
    case(
        "router-without-routes",
        put((("steps", 1, "routes"), DELETE)),
        "steps[1]",
        "'routes'",
        example="routing",
    ),
    case(
        "router-without-default",
        put((("steps", 1, "default"), DELETE)),
        "steps[1]",
        "'default'",
        example="routing",
    ),
    case(
        "rules-route-without-when",
        put((("steps", 1, "routes", 0, "when"), DELETE)),
        "steps[1].routes[0]",
        "missing required field 'when'",
        example="routing",
    ),
    case(
        "min-with-rules",
        put((("steps", 1, "routes", 0, "min"), 0.8)),
        "steps[1].routes[0].min",
        "only used with strategy: score",
        example="routing",
    ),
    case(
        "score-without-expression",
        put((("steps", 1, "strategy"), "score")),
        "steps[1]",
        "missing required field 'score'",
        example="routing",
    ),
    case(
        "score-route-without-min",
        put((("steps", 1, "strategy"), "score"), (("steps", 1, "score"), "1.0")),
        "steps[1].routes[0]",
        "missing required field 'min'",
        example="routing",
    ),
    case(
        "score-with-rules",
        put((("steps", 1, "score"), "1.0")),
        "steps[1].score",
        "only used with strategy: score",
        example="routing",
    ),
    case(
        "map-item-router",
        put((("steps", 3, "item", "type"), "router")),
        "steps[3].item.type",
        "agent, tool",
        example="routing",
    ),
    case(
        "map-item-with-after",
        put((("steps", 3, "item", "after"), ["score"])),
        "steps[3].item.after",
        "unknown field 'after' in an agent map item",
        example="routing",
    ),
    case(
        "map-without-over",
        put((("steps", 3, "over"), DELETE)),
        "steps[3]",
        "'over'",
        example="routing",
    ),
    case(
        "bad-merge",
        put((("steps", 3, "merge"), "concat")),
        "steps[3].merge",
        "list, dict_merge, first_success",
        example="routing",
    ),
    case(
        "sub-workflow-without-workflow",
        put((("steps", 4, "workflow"), DELETE)),
        "steps[4]",
        "'workflow'",
        example="routing",
    ),
]


def rename_fetch_history_to_research(doc):
    doc["steps"][2]["name"] = "research"


REFERENCES = [
    case(
        "duplicate-step-name",
        rename_fetch_history_to_research,
        "steps[2].name",
        "duplicate step name 'research'",
        "steps[1]",
    ),
    case(
        "unknown-after",
        put((("steps", 3, "after", 1), "fetch")),
        "steps[3].after[1]",
        "unknown step 'fetch' in after",
    ),
    case(
        "after-listed-twice",
        put((("steps", 3, "after"), ["research", "research"])),
        "steps[3].after[1]",
        "listed twice",
    ),
    case(
        "unknown-fallback",
        put((("steps", 1, "fallback"), "nope")),
        "steps[1].fallback",
        "unknown step 'nope'",
    ),
    case(
        "fallback-is-ancestor",
        put((("steps", 1, "fallback"), "classify")),
        "steps[1].fallback",
        "'classify' is an ancestor of 'research'",
    ),
    case(
        "fallback-is-self",
        put((("steps", 1, "fallback"), "research")),
        "steps[1].fallback",
        "its own fallback",
    ),
    case(
        "unknown-then",
        put((("steps", 1, "routes", 0, "then"), ["page"])),
        "steps[1].routes[0].then[0]",
        "unknown step 'page' in then",
        example="routing",
    ),
    case(
        "unknown-default-then",
        put((("steps", 1, "default", "then"), ["bin"])),
        "steps[1].default.then[0]",
        "unknown step 'bin'",
        example="routing",
    ),
    case(
        "then-without-after",
        put((("steps", 2, "after"), ["score"])),
        "steps[1].routes[0].then[0]",
        "'page_oncall' is routed to by 'route' but does not list 'route' in its after",
        example="routing",
    ),
    case(
        "duplicate-route-name",
        put((("steps", 1, "routes", 1, "name"), "urgent")),
        "steps[1].routes[1].name",
        "duplicate route name 'urgent'",
        example="routing",
    ),
    case(
        "default-named-like-route",
        put((("steps", 1, "default", "name"), "normal")),
        "steps[1].default.name",
        "duplicate route name 'normal'",
        example="routing",
    ),
]

def spare(name, after=("classify",), **extra):
    """A tool step to serve as a fallback (after `classify`, like research and fetch_history)."""
    return {"name": name, "type": "tool", "tool": "http.get", "after": list(after),
            "params": {"url": "https://crm.example/spare"}, **extra}


def with_fallbacks(*added, **fallbacks):
    """An edit appending the steps `added` (from steps[6] on) and setting the named steps'
    fallbacks: `with_fallbacks(spare("fb"), research="fb")`."""

    def edit(doc: dict) -> None:
        doc["steps"].extend(copy.deepcopy(added))
        for step in doc["steps"]:
            if step["name"] in fallbacks:
                step["fallback"] = fallbacks[step["name"]]

    return edit


def looping(*body, **fallbacks):
    """A loop (steps[6]) whose body is `body`, with the named body steps' fallbacks."""
    body = [dict(step, **({"fallback": fallbacks[step["name"]]} if step["name"] in fallbacks else {}))
            for step in body]
    return with_fallbacks({"name": "refine", "type": "loop", "after": ["classify"],
                           "max_iterations": 2, "until": "steps.b1.state == 'completed'",
                           "body": body})


# Support workflow: classify; research and fetch_history after it; draft after both;
# approve after draft; send after approve. Each case is the whole list of problems.
FALLBACKS = [
    # refused: the fallback waits for its primary, which counts as pending until it ends
    ("runs-after-its-primary", with_fallbacks(spare("fb", after=["research"]), research="fb"),
     [("steps[1].fallback", "fallback 'fb' depends on its primary 'research' (fb -> research), "
       "so it could never run")]),
    ("runs-after-a-step-after-its-primary", with_fallbacks(spare("fb", after=["draft"]), research="fb"),
     [("steps[1].fallback", "fallback 'fb' depends on its primary 'research' (fb -> draft -> research), "
       "so it could never run")]),
    ("an-existing-step-after-its-primary", with_fallbacks(research="approve"),
     [("steps[1].fallback", "fallback 'approve' depends on its primary 'research' "
       "(approve -> draft -> research), so it could never run")]),
    ("runs-after-another-fallback-that-waits-for-a-step-after-its-primary",
     with_fallbacks(spare("fa"), spare("fc", after=["fa"]), research="fc", draft="fa"),
     [("steps[1].fallback", "fallback 'fc' depends on its primary 'research' "
       "(fc -> fa (fallback of draft) -> draft -> research), so it could never run")]),
    ("each-runs-after-the-others-primary",
     with_fallbacks(spare("fa", after=["fetch_history"]), spare("fc", after=["research"]),
                    research="fa", fetch_history="fc"),
     [("steps[1].fallback", "fallback 'fa' depends on its primary 'research' (fa -> fetch_history -> "
       "fc (fallback of fetch_history) -> research), so it could never run if 'fetch_history' fails too"),
      ("steps[2].fallback", "fallback 'fc' depends on its primary 'fetch_history' (fc -> research -> "
       "fa (fallback of research) -> fetch_history), so it could never run if 'research' fails too")]),
    ("in-a-loop-body-runs-after-its-primary", looping(spare("b1", after=()), spare("fb", after=["b1"]), b1="fb"),
     [("steps[6].body[0].fallback", "fallback 'fb' depends on its primary 'b1' (fb -> b1), so it could never run")]),
    # refused: fallbacks of each other, which each wait for the other to fail
    ("mutual", with_fallbacks(spare("fb1"), spare("fb2"), fb1="fb2", fb2="fb1"),
     [("steps[6].fallback", "fallbacks form a cycle: fb1 -> fb2 -> fb1 "
       "(each waits for the one before it to fail), so none of them could ever run")]),
    ("a-cycle-of-three", with_fallbacks(spare("fb1"), spare("fb2"), fb2="research", research="fb1", fb1="fb2"),
     [("steps[1].fallback", "fallbacks form a cycle: research -> fb1 -> fb2 -> research "
       "(each waits for the one before it to fail), so none of them could ever run")]),
    # refused: what the scheduler does not run (one primary per fallback, no fallback chains)
    ("of-two-primaries", with_fallbacks(spare("fb"), research="fb", fetch_history="fb"),
     [("steps[2].fallback", "'fb' is already the fallback of 'research' (steps[1]); "
       "a step can be the fallback of one step only")]),
    ("with-a-fallback-of-its-own", with_fallbacks(spare("fb1"), spare("fb2"), research="fb1", fb1="fb2"),
     [("steps[6].fallback", "'fb1' is the fallback of 'research', so it cannot have a fallback of its own: "
       "if 'fb1' fails too, 'research' fails even when 'fb2' completes")]),
    # allowed
    ("sharing-its-primarys-upstream", with_fallbacks(spare("fb"), research="fb"), []),
    ("after-its-primarys-own-upstream", with_fallbacks(spare("fb", after=["research", "fetch_history"]),
                                                       draft="fb"), []),
    ("an-existing-step-beside-its-primary", with_fallbacks(fetch_history="research"), []),
    ("one-each-for-two-primaries", with_fallbacks(spare("fb1"), spare("fb2"), research="fb1",
                                                  fetch_history="fb2"), []),
    ("after-a-sibling-with-a-fallback-of-its-own",
     with_fallbacks(spare("fa", after=["fetch_history"]), spare("fc"), research="fa", fetch_history="fc"), []),
    ("with-steps-after-it", with_fallbacks(spare("fb"), spare("after_fb", after=["fb"]), research="fb"), []),
    ("in-a-loop-body-sharing-its-primarys-upstream",
     looping(spare("b0", after=()), spare("b1", after=["b0"]), spare("fb", after=["b0"]), b1="fb"), []),
]


@pytest.mark.parametrize("edit, expected", [pytest.param(e, x, id=i) for i, e, x in FALLBACKS])
def test_a_fallback_is_refused_exactly_when_the_scheduler_could_never_run_it(
    edit, expected, support_workflow, validate
):
    edit(support_workflow)

    assert [(p.path, p.message) for p in validate(support_workflow)] == expected


GRAPH = [
    case(
        "self-cycle",
        put((("steps", 0, "after"), ["classify"])),
        "steps[0].after",
        "cycle: classify -> classify",
    ),
    case(
        "two-step-cycle",
        put((("steps", 1, "after"), ["classify", "draft"])),
        "steps[1].after",
        "cycle: research -> draft -> research",
    ),
    case(
        "when-literal-false", put((("steps", 1, "when"), "false")), "steps[1].when", "always false"
    ),
    case(
        "join-all-after-never-running-step",
        put((("steps", 1, "when"), " false ")),
        "steps[3].after",
        "depends on 'research', which never runs",
    ),
    case(
        "downstream-of-cycle",
        put((("steps", 1, "after"), ["fetch_history"]), (("steps", 2, "after"), ["research"])),
        "steps[3].after",
        "depends on 'research', which is part of a cycle",
    ),
    case(
        "join-any-all-dependencies-never-run",
        put(
            (("steps", 1, "when"), "false"),
            (("steps", 2, "when"), "false"),
            (("steps", 3, "join"), "any"),
        ),
        "steps[3].after",
        "none of its dependencies",
    ),
    case(
        "join-all-over-exclusive-routes",
        put((("steps", 5, "join"), "all"), (("steps", 5, "after"), ["page_oncall", "archive"])),
        "steps[5].after",
        "'page_oncall' (route 'urgent' of router 'route')",
        "'archive' (route 'ignore')",
        "never both complete",
        example="routing",
    ),
    case(
        "routed-step-after-other-route",
        put((("steps", 4, "after"), ["route", "page_oncall"])),
        "steps[4].after",
        "runs only on route 'ignore'",
        "depends on 'page_oncall'",
        example="routing",
    ),
]

REGISTRIES = [
    case(
        "unknown-model",
        put((("steps", 0, "model"), "gpt-9")),
        "steps[0].model",
        "unknown model 'gpt-9'",
        "known models: deep, fast",
    ),
    case(
        "unknown-tool",
        put((("steps", 2, "tool"), "http.post")),
        "steps[2].tool",
        "unknown tool 'http.post'",
        "email.send, http.get, pager.page",
    ),
    case(
        "unknown-compensation-tool",
        put((("steps", 5, "compensate", "tool"), "email.recall")),
        "steps[5].compensate.tool",
        "unknown tool 'email.recall'",
    ),
    case(
        "literal-params-rejected-by-tool",
        put((("steps", 2, "params"), {"url": 3})),
        "steps[2].params.url",
        "not accepted by tool 'http.get'",
        "not of type 'string'",
    ),
    case(
        "literal-params-missing-required",
        put((("steps", 2, "params"), {})),
        "steps[2].params",
        "not accepted by tool 'http.get'",
        "'url' is a required property",
    ),
    case(
        "templated-params-missing-required",
        put((("steps", 5, "params", "body"), DELETE)),
        "steps[5].params",
        "missing 'body', required by tool 'email.send'",
    ),
    case(
        "map-item-unknown-model",
        put((("steps", 3, "item", "model"), "slow")),
        "steps[3].item.model",
        "unknown model 'slow'",
        example="routing",
    ),
    case(
        "unknown-workflow",
        put((("steps", 4, "workflow"), "enrich")),
        "steps[4].workflow",
        "unknown workflow 'enrich'",
        example="routing",
    ),
    case(
        "workflow-runs-itself",
        put((("steps", 4, "workflow"), "triage")),
        "steps[4].workflow",
        "cannot run itself",
        example="routing",
    ),
    case(
        "literal-input-rejected-by-child",
        put((("steps", 4, "input"), {"email": 3})),
        "steps[4].input.email",
        "not accepted by workflow 'enrich-customer'",
        example="routing",
    ),
    case(
        "templated-input-missing-required",
        put((("steps", 4, "input"), {"mail": "{{ input.body }}"})),
        "steps[4].input",
        "missing 'email', required by workflow 'enrich-customer'",
        example="routing",
    ),
]

EXPRESSIONS = [
    case(
        "when-syntax-error",
        put((("steps", 1, "when"), "steps.classify.output.category ==")),
        "steps[1].when",
        "invalid expression: CEL syntax error",
    ),
    case(
        "when-unknown-root",
        put((("steps", 1, "when"), "ticket.body != ''")),
        "steps[1].when",
        "unknown variable 'ticket'",
        "available: input, steps",
    ),
    case(
        "when-non-ancestor",
        put((("steps", 1, "when"), "steps.fetch_history.output != null")),
        "steps[1].when",
        "steps.fetch_history is not available",
        "not an ancestor of 'research'",
    ),
    case(
        "when-unknown-step",
        put((("steps", 1, "when"), "has(steps.triage.output)")),
        "steps[1].when",
        "unknown step 'triage'",
    ),
    case(
        "when-own-output",
        put((("steps", 1, "when"), "steps.research.output == null")),
        "steps[1].when",
        "cannot read its own output",
    ),
    case(
        "when-item-outside-map",
        put((("steps", 1, "when"), "item == 1")),
        "steps[1].when",
        "unknown variable 'item'",
    ),
    case(
        "script-when-syntax-error",
        put((("steps", 0, "script", 0, "when"), "input.body.contains(")),
        "steps[0].script[0].when",
        "CEL syntax error",
    ),
    case(
        "route-when-non-ancestor",
        put((("steps", 1, "routes", 0, "when"), "steps.archive.output != null")),
        "steps[1].routes[0].when",
        "'archive' is not an ancestor of 'route'",
        example="routing",
    ),
    case(
        "score-syntax-error",
        put(
            (("steps", 1, "strategy"), "score"),
            (("steps", 1, "score"), "steps.score.output.urgency *"),
            (("steps", 1, "routes"), [{"name": "urgent", "min": 0.8, "then": ["page_oncall"]}]),
        ),
        "steps[1].score",
        "CEL syntax error",
        example="routing",
    ),
    case(
        "over-uses-item",
        put((("steps", 3, "over"), "item.tickets")),
        "steps[3].over",
        "unknown variable 'item'",
        example="routing",
    ),
    case(
        "map-item-script-uses-unknown",
        put((("steps", 3, "item", "script", 0, "when"), "position == 0")),
        "steps[3].item.script[0].when",
        "unknown variable 'position'",
        "available: index, input, item, steps",
        example="routing",
    ),
]

TEMPLATES = [
    case(
        "prompt-syntax-error",
        put((("steps", 0, "prompt"), "Classify {{ input.body ")),
        "steps[0].prompt",
        "invalid template",
        "line 1",
    ),
    case(
        "prompt-unknown-variable",
        put((("steps", 0, "prompt"), "Classify {{ ticket }}")),
        "steps[0].prompt",
        "unknown template variable 'ticket'",
    ),
    case(
        "system-syntax-error",
        put((("steps", 3, "system"), "{% if %}")),
        "steps[3].system",
        "invalid template",
    ),
    case(
        "params-non-ancestor",
        put((("steps", 2, "params", "url"), "{{ steps.draft.output.body }}")),
        "steps[2].params.url",
        "steps.draft is not available",
    ),
    case(
        "params-nested-syntax-error",
        put((("steps", 5, "params", "body"), ["ok", "{{ oops"])),
        "steps[5].params.body[1]",
        "invalid template",
    ),
    case(
        "instructions-unknown-step",
        put((("steps", 4, "instructions"), "{{ steps['review'].output }}")),
        "steps[4].instructions",
        "unknown step 'review'",
    ),
    case(
        "item-outside-map",
        put((("steps", 2, "params", "message"), "{{ item }}")),
        "steps[2].params.message",
        "unknown template variable 'item'",
        example="routing",
    ),
    case(
        "map-item-prompt-non-ancestor",
        put((("steps", 3, "item", "prompt"), "{{ steps.archive.output }}")),
        "steps[3].item.prompt",
        "'archive' is not an ancestor of 'summarize_each'",
        example="routing",
    ),
    case(
        "sub-workflow-input-syntax-error",
        put((("steps", 4, "input", "email"), "{{ input.body }")),
        "steps[4].input.email",
        "invalid template",
        example="routing",
    ),
]

SCHEMAS = [
    case(
        "input-schema-unknown-type",
        put((("input_schema", "type"), "strin")),
        "input_schema.type",
        "unknown JSON Schema type 'strin'",
    ),
    case(
        "input-schema-not-schema",
        put((("input_schema",), "object")),
        "input_schema",
        "must be a mapping or a boolean",
    ),
    case(
        "output-schema-bad-required",
        put((("steps", 1, "output_schema", "required"), "notes")),
        "steps[1].output_schema.required",
        "not a valid JSON Schema",
    ),
    case(
        "output-schema-bad-regex",
        put((("steps", 1, "output_schema", "properties", "notes", "pattern"), "(unclosed")),
        "steps[1].output_schema.properties.notes.pattern",
        "invalid regular expression",
    ),
    case(
        "step-input-schema-invalid",
        put((("steps", 3, "input_schema", "properties", "research", "minProperties"), -1)),
        "steps[3].input_schema.properties.research.minProperties",
        "not a valid JSON Schema",
    ),
    case(
        "step-input-schema-not-object",
        put((("steps", 3, "input_schema", "type"), "array")),
        "steps[3].input_schema.type",
        "must have type: object",
    ),
    case(
        "map-item-output-schema-invalid",
        put((("steps", 3, "item", "output_schema"), {"type": 3})),
        "steps[3].item.output_schema.type",
        "unknown JSON Schema type 3",
        example="routing",
    ),
]

OUTPUTS_AND_COMPATIBILITY = [
    case(
        "scripted-output-wrong-enum",
        put((("steps", 0, "script", 0, "output", "category"), "sales")),
        "steps[0].script[0].output.category",
        "scripted output does not match output_schema",
        "'sales'",
    ),
    case(
        "scripted-output-missing-field",
        put((("steps", 0, "script", 1, "output"), {"category": "billing"})),
        "steps[0].script[1].output",
        "'urgency' is a required property",
    ),
    case(
        "scripted-output-extra-field",
        put((("steps", 0, "script", 1, "output", "mood"), "calm")),
        "steps[0].script[1].output",
        "'mood' was unexpected",
    ),
    case(
        "map-item-scripted-output",
        put((("steps", 3, "item", "script", 1, "output"), 7)),
        "steps[3].item.script[1].output",
        "7 is not of type 'string'",
        example="routing",
    ),
    case(
        "consumer-requires-more",
        put(
            (
                ("steps", 3, "input_schema", "properties", "classify", "required"),
                ["category", "priority"],
            )
        ),
        "steps[3].input_schema.properties.classify",
        "step 'classify' output is not accepted",
        "'priority'",
    ),
    case(
        "consumer-type-mismatch",
        put(
            (
                ("steps", 3, "input_schema", "properties", "classify", "properties", "category"),
                {"type": "integer"},
            )
        ),
        "steps[3].input_schema.properties.classify",
        "output.category: the producer may output 'billing', which the consumer rejects",
    ),
    case(
        "consumer-names-non-ancestor",
        put((("steps", 3, "input_schema", "properties", "send"), {"type": "object"})),
        "steps[3].input_schema.properties.send",
        "'send' is not an ancestor of 'draft'",
    ),
    case(
        "consumer-names-unknown-step",
        put((("steps", 3, "input_schema", "properties", "crm"), {"type": "object"})),
        "steps[3].input_schema.properties.crm",
        "unknown step 'crm'",
    ),
]


@pytest.mark.parametrize(
    "rule",
    STRUCTURE
    + REFERENCES
    + GRAPH
    + REGISTRIES
    + EXPRESSIONS
    + TEMPLATES
    + SCHEMAS
    + OUTPUTS_AND_COMPATIBILITY,
)
def test_rule_violation_is_reported_at_its_path(
    rule: Case, support_workflow, routing_workflow, validate
):
    doc = support_workflow if rule.example == "support" else routing_workflow
    rule.edit(doc)

    problems = validate(doc)

    matching = [
        p for p in problems if p.path == rule.path and all(f in p.message for f in rule.fragments)
    ]
    assert matching, (
        f"expected a problem at {rule.path!r} containing {rule.fragments}; got {problems}"
    )


def test_routing_workflow_is_valid(routing_workflow, validate):
    assert validate(routing_workflow) == []


def test_join_any_over_exclusive_routes_is_valid(routing_workflow, validate):
    # `report` joins page_oncall, summarize_each and archive with join: any.
    assert routing_workflow["steps"][5]["join"] == "any"
    assert validate(routing_workflow) == []


def test_scripted_failure_needs_no_output(support_workflow, validate):
    support_workflow["steps"][0]["script"].insert(0, {"error": "rate_limit"})
    assert validate(support_workflow) == []


def test_score_router_is_valid(routing_workflow, validate):
    router = routing_workflow["steps"][1]
    router["strategy"] = "score"
    router["score"] = "steps.score.output.urgency"
    router["routes"] = [
        {"name": "urgent", "min": 0.8, "then": ["page_oncall"]},
        {"name": "normal", "min": 0.3, "then": ["summarize_each"]},
    ]
    assert validate(routing_workflow) == []


def test_each_cycle_is_reported_once(support_workflow, validate):
    support_workflow["steps"][1]["after"] = ["classify", "draft"]  # research <-> draft
    support_workflow["steps"][4]["after"] = ["draft", "send"]  # approve <-> send

    cycles = [p for p in validate(support_workflow) if p.message.startswith("cycle:")]

    assert [(p.path, p.message) for p in cycles] == [
        ("steps[1].after", "cycle: research -> draft -> research"),
        ("steps[4].after", "cycle: approve -> send -> approve"),
    ]


def test_steps_inside_a_cycle_are_not_also_reported_unreachable(support_workflow, validate):
    support_workflow["steps"][1]["after"] = ["classify", "draft"]

    messages = [p.message for p in validate(support_workflow) if p.path == "steps[1].after"]

    assert messages == ["cycle: research -> draft -> research"]


def test_structural_errors_do_not_hide_other_problems(support_workflow, validate):
    support_workflow["steps"][0]["timeout_s"] = "soon"
    support_workflow["steps"][1]["model"] = "gpt-9"
    support_workflow["steps"][3]["after"] = ["research", "fetch_history", "nope"]
    support_workflow["steps"][5]["extra"] = True

    assert [p.path for p in validate(support_workflow)] == [
        "steps[0].timeout_s",
        "steps[1].model",
        "steps[3].after[2]",
        "steps[5].extra",
    ]


def test_extra_fields_are_rejected_at_every_level(support_workflow, validate):
    support_workflow["steps"][0]["script"][0]["latency"] = 3
    support_workflow["steps"][5]["compensate"]["retries"] = 2
    support_workflow["budget"]["currency"] = "EUR"

    assert {p.path: p.message for p in validate(support_workflow)} == {
        "budget.currency": "unknown field 'currency' in a budget",
        "steps[0].script[0].latency": "unknown field 'latency' in a scripted reply",
        "steps[5].compensate.retries": "unknown field 'retries' in a compensation",
    }


def test_validate_is_reserved_as_a_workflow_name():
    from orchestrator.engine.definitions import validate_definition

    problems = validate_definition(
        {"name": "validate", "input_schema": {"type": "object"},
         "steps": [{"name": "a", "type": "tool", "tool": "core.echo"}]},
        tools={"core.echo": {"type": "object"}}, models=[])
    assert [p.path for p in problems] == ["name"]
