"""Definition validation: every problem with a definition, each with its path, in one pass.

Owns `validate_definition`. It runs the structural check (`structure.py`) and then every
check that relates fields to each other or to the outside world: step references,
cycles and unreachable steps (`graph.py`), registered tools, models and workflows,
expressions, templates, embedded JSON Schemas, scripted replies and schema compatibility
between steps (`compat.py`). Each check reads only the parts of the document that have
the right shape, so a document with structural errors still gets its other problems
reported. It must never raise for a bad document and never stop at the first problem.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any

from jsonschema import Draft202012Validator

from .compat import schema_accepts
from .expressions import (
    ExpressionError,
    ExpressionLimitExceeded,
    evaluate_expression,
    expression_roots,
    referenced_steps,
)
from .format import (
    CONTEXT_ROOTS,
    DEFAULT_INPUT_DEADLINE_S,
    DEFAULT_ON_TIMEOUT,
    DEFAULT_SLEEP_TIMEZONE,
    HUMAN_GATE_TIMEOUT_S,
    LOOP_BODY_ROOTS,
    MAP_ITEM_ROOTS,
    ON_TIMEOUT_CHOICES,
    RISK_RULE_ROOTS,
    STEP_RUN_NAME_CHARS,
    calls_model,
)
from .gates import CONTEXT, PROPOSAL, STEP, approves_problem, gate_binding
from .graph import Graph, Node
from .inputs import form_problems
from .inputs import output_schema as input_output_schema
from .limits import (
    MAX_DEFINITION_BYTES,
    MAX_DEPTH,
    MAX_LOOP_ITERATIONS,
    MAX_STEPS,
    check_allowance,
    document_problems,
)
from .problems import PathPart, Problem, ProblemLog
from .proposals import normalize_proposal, proposal_problems
from .shapes import UNKNOWN, sample
from .structure import describe_type, is_valid_schema, schema_problems, structure_problems
from .templates import (
    TemplateError,
    TemplateLimitExceeded,
    TemplateUndefined,
    TemplateUnsafe,
    contains_template,
    is_template,
    render_template,
    template_names,
    template_references,
    template_step_references,
)
from .times import TimeInvalid, parse_time, zone

# CEL errors that mean a read of something the shapes do not have (not a value-dependent
# failure such as comparing a sample string with a number).
_MISSING_READ = ("no such member", "no such key", "does not support field selection")

Parts = tuple[PathPart, ...]


def validate_definition(
    doc: object,
    *,
    tools: Mapping[str, dict],
    models: Collection[str],
    workflows: Callable[[str], dict | None] = lambda name: None,
    egress: Callable[[str, dict], Iterable[tuple[Parts, str]]] | None = None,
    tool_params: Callable[[str, dict], Iterable[tuple[Parts, str]]] | None = None,
    side_effect_tools: Collection[str] = (),
) -> list[Problem]:
    """Return every problem with `doc` in document order; [] means it is valid.

    `tools` maps each registered tool to its params JSON Schema, `models` names the
    registered models, and `workflows(name)` returns a saved workflow's latest input
    schema (None if there is no such workflow). `egress(tool, params)`, if given, yields
    (path within params, message) for each URL the egress policy refuses
    (`orchestrator.integrations.egress.definition_checker`). `tool_params(tool, params)`, if given,
    yields (path within params, message) for each param the tool's named connection refuses
    (`orchestrator.integrations.tools.checks.definition_checker`). `side_effect_tools` names the
    registered tools that change the world whatever a step says: a step of one is never
    reused (`cache`). Never raises for a bad `doc`.
    """
    if not isinstance(doc, dict):
        return [Problem("", f"a definition must be a mapping, not {describe_type(doc)}")]
    log = ProblemLog()
    # First, iteratively: everything after this may recurse over the document or cost
    # time in proportion to its size.
    for parts, message in document_problems(
        doc, max_bytes=MAX_DEFINITION_BYTES, max_depth=MAX_DEPTH, what="the definition"
    ):
        log.add(parts, message)
    if len(log):
        return log.in_document_order(doc)
    for parts, message in _not_json(doc, ()):
        log.add(parts, message)
    if len(log):
        # Nothing else can be checked reliably until the document is plain JSON data.
        return log.in_document_order(doc)
    steps = doc.get("steps")
    if isinstance(steps, list) and len(steps) > MAX_STEPS:
        # Nothing else is checked on a graph this large.
        log.add(("steps",), f"must have at most {MAX_STEPS:,} items, not {len(steps):,}")
        return log.in_document_order(doc)
    for parts, message in structure_problems(doc):
        log.add(parts, message)
    with check_allowance():
        _Check(doc, tools=tools, models=models, workflows=workflows, egress=egress,
               tool_params=tool_params, side_effect_tools=frozenset(side_effect_tools),
               log=log).run()
    return log.in_document_order(doc)


def _not_json(value: object, parts: Parts) -> Iterator[tuple[Parts, str]]:
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                yield parts, f"mapping key {key!r} must be a string, not {describe_type(key)}"
            else:
                yield from _not_json(item, (*parts, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _not_json(item, (*parts, index))
    elif not (value is None or isinstance(value, str | int | float | bool)):
        yield parts, f"{type(value).__name__} values are not allowed; use plain JSON data"


class _PrefixedLog:
    """A loop body's problems, moved under the loop: `steps[0].x` becomes
    `steps[3].body[0].x`."""

    def __init__(self, log: ProblemLog | _PrefixedLog, prefix: Parts):
        self.log, self.prefix = log, tuple(prefix)

    def add(self, parts: Parts, message: str) -> None:
        parts = tuple(parts)
        if parts[:1] == ("steps",):
            parts = parts[1:]
        self.log.add((*self.prefix, *parts), message)

    def __len__(self) -> int:
        return len(self.log)


def _if_failing(steps: list[str]) -> str:
    if not steps:
        return ""
    return f" if {' and '.join(repr(step) for step in steps)} {'fails' if len(steps) == 1 else 'fail'} too"


def _known(kind: str, names: Collection[str]) -> str:
    if not names:
        return f"no {kind}s are registered"
    return f"known {kind}s: {', '.join(sorted(names))}"


class _Check:
    """The cross-field checks over one document; results go to `log`."""

    def __init__(self, doc: dict, *, tools, models, workflows, log: ProblemLog, egress=None,
                 tool_params=None, roots: frozenset[str] = CONTEXT_ROOTS,
                 side_effect_tools: frozenset[str] = frozenset()):
        self.doc = doc
        self.side_effect_tools = side_effect_tools
        # The variables expressions and templates may read: a loop's body also has `iteration`.
        self.roots = roots
        self.egress = egress
        self.tool_params = tool_params
        self.tools = tools
        self.models = models
        self.workflows = workflows
        self.log = log
        raw_steps = doc.get("steps")
        self.steps: list[tuple[int, dict]] = [
            (index, step)
            for index, step in enumerate(raw_steps if isinstance(raw_steps, list) else [])
            if isinstance(step, dict)
        ]
        # Step name -> the steps it transitively waits for; filled once the graph is built.
        self.ancestors: dict[str, frozenset[str]] = {}
        # Step name -> the ancestors that surely completed whenever it runs.
        self.completed: dict[str, frozenset[str]] = {}
        # The dependency graph, once built; and the steps on a cycle of fallbacks.
        self.graph = Graph([])
        self.in_fallback_cycle: set[str] = set()
        # Map step name -> (full, minimal) sample of one item, for its item's templates.
        self.item_samples: dict[str, tuple[object, object]] = {}
        # Names of the steps in every loop's body seen so far (unique across the workflow).
        self.body_names: set[str] = set()
        # Step name -> index of its first definition; later duplicates are problems.
        self.index_of: dict[str, int] = {}
        for index, step in self.steps:
            name = step.get("name")
            if isinstance(name, str):
                self.index_of.setdefault(name, index)

    def add(self, parts: Parts, message: str) -> None:
        self.log.add(parts, message)

    # --- the passes ---------------------------------------------------------------

    def run(self) -> None:
        self.check_schema_field(("input_schema",), self.doc.get("input_schema"))
        self.check_steps()
        self.check_audit()
        self.check_concurrency()

    def check_concurrency(self) -> None:
        """A concurrency key reads the run's input, and nothing a step produces."""
        concurrency = self.doc.get("concurrency")
        key = concurrency.get("key") if isinstance(concurrency, dict) else None
        if isinstance(key, str):
            self.check_template(("concurrency", "key"), key, None, frozenset(), frozenset({"input"}))
        steps = self.doc.get("steps")
        for i, step in enumerate(steps if isinstance(steps, list) else []):
            concurrency = step.get("concurrency") if isinstance(step, dict) else None
            key = concurrency.get("key") if isinstance(concurrency, dict) else None
            if isinstance(key, str):
                self.check_template(("steps", i, "concurrency", "key"), key, None, frozenset(),
                                    frozenset({"input"}))

    def check_steps(self) -> None:
        self.check_names()
        self.check_after()
        graph = self.build_graph()
        cycles = graph.cycles()
        for cycle in cycles:
            self.add(("steps", self.index_of[cycle[0]], "after"), "cycle: " + " -> ".join(cycle))
        for name, (field, reason) in graph.never_runs(cycles).items():
            self.add(("steps", self.index_of[name], field), reason)
        for cycle in graph.fallback_cycles():
            self.in_fallback_cycle.update(cycle)
            self.add(
                ("steps", self.index_of[cycle[0]], "fallback"),
                "fallbacks form a cycle: " + " -> ".join(cycle)
                + " (each waits for the one before it to fail), so none of them could ever run",
            )
        self.graph = graph
        self.ancestors = graph.ancestors()
        self.completed = graph.completed_ancestors()
        for index, step in self.steps:
            self.check_step(index, step)

    def check_names(self) -> None:
        for index, step in self.steps:
            name = step.get("name")
            if isinstance(name, str) and self.index_of[name] != index:
                first = self.index_of[name]
                self.add(
                    ("steps", index, "name"),
                    f"duplicate step name {name!r} (already used by steps[{first}])",
                )

    def check_after(self) -> None:
        for index, step in self.steps:
            seen = set()
            for position, dep in enumerate(self.list_of_str(step.get("after"))):
                if dep is None:
                    continue
                parts = ("steps", index, "after", position)
                if dep not in self.index_of:
                    self.add(parts, f"unknown step {dep!r} in after")
                elif dep in seen:
                    self.add(parts, f"step {dep!r} is listed twice")
                seen.add(dep)

    def build_graph(self) -> Graph:
        nodes = []
        routes: dict[str, dict[str, frozenset[str]]] = {}
        for index, step in self.steps:
            name = step.get("name")
            if not isinstance(name, str) or self.index_of[name] != index:
                continue
            after = tuple(
                dict.fromkeys(
                    dep for dep in self.list_of_str(step.get("after")) if dep in self.index_of
                )
            )
            when = step.get("when")
            fallback = step.get("fallback")
            nodes.append(
                Node(
                    name=name,
                    after=after,
                    join="any" if step.get("join") == "any" else "all",
                    always_false=isinstance(when, str) and when.strip() == "false",
                    fallback=fallback
                    if isinstance(fallback, str) and fallback in self.index_of and fallback != name
                    else None,
                )
            )
            if step.get("type") == "router":
                routes[name] = {
                    route_name: frozenset(s for s in then if s in self.index_of)
                    for route_name, then, _ in self.router_branches(step)
                }
        return Graph(nodes, routes)

    # --- one step -------------------------------------------------------------------

    def check_step(self, index: int, step: dict) -> None:
        at: Parts = ("steps", index)
        name = step.get("name") if isinstance(step.get("name"), str) else None
        upstream = self.ancestors.get(name, frozenset()) if name else frozenset()
        self.check_expression((*at, "when"), step.get("when"), name, upstream, self.roots)
        self.check_fallback(index, step, name, upstream)
        self.check_retry(at, step.get("retry"))
        self.check_schema_field((*at, "output_schema"), step.get("output_schema"))
        self.check_step_input_schema(at, step.get("input_schema"), name, upstream)
        self.check_step_budget(at, step)
        self.check_cache(at, step, name, upstream)

        step_type = step.get("type")
        if step_type in ("agent", "tool"):
            self.check_body(at, step, name, upstream, self.roots)
        elif step_type == "router":
            self.check_router(at, step, name, upstream)
        elif step_type == "map":
            self.check_map(at, step, name, upstream)
        elif step_type == "human_gate":
            self.check_template(
                (*at, "instructions"), step.get("instructions"), name, upstream, self.roots
            )
            self.check_gate(at, step, name)
        elif step_type == "sub_workflow":
            self.check_sub_workflow(at, step, name, upstream)
        elif step_type == "loop":
            self.check_loop(at, step, name, upstream)
        elif step_type == "sleep":
            self.check_sleep(at, step, name, upstream)
        elif step_type == "human_input":
            self.check_human_input(at, step, name, upstream)
        elif step_type == "wait":
            self.check_wait(at, step, name, upstream)

    def check_cache(self, at: Parts, step: dict, name, upstream) -> None:
        """A reusable result (docs/definitions.md#cache): its key is a template over what the
        step reads; never of a step with side effects (a reused result would skip an effect
        each run must have), nor of a step in a loop's body (each iteration runs it anew). The
        step kinds that have no `cache` at all are refused by the format schema."""
        cache = step.get("cache")
        if not isinstance(cache, dict):
            return
        at = (*at, "cache")
        if LOOP_BODY_ROOTS <= self.roots:
            self.add(at, "a step in a loop's body is never reused: each iteration runs it anew")
            return
        if step.get("type") == "tool":
            tool = step.get("tool")
            if step.get("side_effect") is True:
                self.add(at, "a step with side_effect: true is never reused: each run must "
                             "perform its effect")
            elif isinstance(tool, str) and tool in self.side_effect_tools:
                self.add(at, f"tool {tool!r} changes the world whatever the step says, so its "
                             "step is never reused")
            elif isinstance(step.get("compensate"), dict):
                self.add(at, "a step with a compensation has an effect to undo, so it is never "
                             "reused")
        self.check_template((*at, "key"), cache.get("key"), name, upstream, self.roots)
        self.check_key_secrets((*at, "key"), cache.get("key"))

    def check_key_secrets(self, at: Parts, key: object) -> None:
        """A cache key never names a secret input (`writeOnly` in the input schema): it would
        render only the secret's marker, so every run would share one key whatever its secret."""
        schema = self.doc.get("input_schema")
        properties = schema.get("properties") if isinstance(schema, dict) else None
        if not isinstance(key, str) or not isinstance(properties, dict):
            return
        try:
            read = template_references(key, "input")
        except TemplateError:
            return  # reported by check_template
        for field in sorted(read):
            if isinstance(properties.get(field), dict) and properties[field].get("writeOnly") is True:
                self.add(at, f"the key reads input.{field}, a secret input (writeOnly): a secret "
                             "never enters a cache key, and a run with secret inputs is never "
                             "reused")

    def check_human_input(self, at: Parts, step: dict, name, upstream) -> None:
        """A form that can be drawn and checked (a valid JSON Schema of flat fields), its
        instructions and evidence templates checked like every other, an escalation that comes
        before the deadline and goes to another group."""
        form = step.get("form")
        self.check_schema_field((*at, "form"), form)
        if is_valid_schema(form):
            for parts, message in form_problems(form, (*at, "form")):
                self.add(parts, message)
        self.check_template((*at, "instructions"), step.get("instructions"), name, upstream,
                            self.roots)
        evidence = step.get("evidence")
        if isinstance(evidence, dict):
            for label, text in evidence.items():
                self.check_template((*at, "evidence", label), text, name, upstream, self.roots)
        has_to, has_after = "escalate_to" in step, "escalate_after_s" in step
        if has_to != has_after:
            missing = "escalate_after_s" if has_to else "escalate_to"
            self.add((*at, missing), "escalate_to and escalate_after_s go together: "
                     f"add {missing}")
        after_s = step.get("escalate_after_s")
        deadline_s = step.get("deadline_s", DEFAULT_INPUT_DEADLINE_S)
        if _is_number(after_s) and _is_number(deadline_s) and after_s >= deadline_s:
            self.add((*at, "escalate_after_s"),
                     f"escalate_after_s ({after_s}) must be less than deadline_s ({deadline_s})")
        if has_to and step.get("escalate_to") == step.get("group"):
            self.add((*at, "escalate_to"), "escalate_to names the step's own group")

    def check_wait(self, at: Parts, step: dict, name, upstream) -> None:
        """A payload schema that is a schema; a correlation key template checked like every
        other; an `on_timeout` that is `fail`, `continue` or a step that runs after this one
        (and then no `fallback`: the route is what its timeout does)."""
        self.check_schema_field((*at, "schema"), step.get("schema"))
        key = step.get("correlation_key")
        if isinstance(key, str) and is_template(key):
            self.check_template((*at, "correlation_key"), key, name, upstream, self.roots)
        target = step.get("on_timeout", DEFAULT_ON_TIMEOUT)
        if not isinstance(target, str) or target in ON_TIMEOUT_CHOICES:
            return
        where = (*at, "on_timeout")
        if target not in self.index_of:
            self.add(where, f"'{target}' is neither fail, continue nor a step of this workflow")
        elif target == name:
            self.add(where, "a wait step cannot route its timeout to itself")
        elif name not in (dict(self.steps)[self.index_of[target]].get("after") or []):
            self.add(where, f"step '{target}' must list '{name}' in its after to run on its "
                            "timeout")
        if step.get("fallback"):
            self.add((*at, "fallback"), "a wait step whose on_timeout names a step has no "
                                        "fallback: the step it names runs on its timeout")

    def check_sleep(self, at: Parts, step: dict, name, upstream) -> None:
        """Exactly one of `for_s` and `until`; a time zone that exists, only with `until`; an
        `until` template checked like every other, a literal one read as a time now."""
        has_for, has_until = "for_s" in step, "until" in step
        if not has_for and not has_until:
            self.add(at, "a sleep step needs for_s (seconds to wait) or until (a time to wait for)")
        elif has_for and has_until:
            self.add((*at, "until"), "give for_s or until, not both")
        timezone = step.get("timezone", DEFAULT_SLEEP_TIMEZONE)
        if "timezone" in step and not has_until:
            self.add((*at, "timezone"), "timezone is only used with until")
        elif isinstance(timezone, str) and timezone:
            try:
                zone(timezone)
            except TimeInvalid as error:
                self.add((*at, "timezone"), str(error))
                return
        until = step.get("until")
        if not isinstance(until, str) or not until:
            return
        if is_template(until):
            self.check_template((*at, "until"), until, name, upstream, self.roots)
        elif isinstance(timezone, str) and timezone:
            try:
                parse_time(until, timezone)
            except TimeInvalid as error:
                self.add((*at, "until"), str(error))

    def check_loop(self, at: Parts, step: dict, name, upstream) -> None:
        """A loop's body is checked as a small workflow of its own (its `after`, references and
        templates stay inside the body, which also reads `iteration`); its `until` reads only
        body steps; body step names are unique in the whole definition and leave room for the
        iteration suffix of their step runs (`draft[12]`)."""
        self.check_templates_in((*at, "input"), step.get("input"), name, upstream, self.roots)
        body = step.get("body")
        if not isinstance(body, list):
            return
        nested = _Check(
            {"name": self.doc.get("name"), "input_schema": self.doc.get("input_schema"), "steps": body},
            tools=self.tools, models=self.models, workflows=self.workflows, egress=self.egress,
            tool_params=self.tool_params, log=_PrefixedLog(self.log, (*at, "body")),
            roots=self.roots | LOOP_BODY_ROOTS, side_effect_tools=self.side_effect_tools,
        )
        nested.check_steps()
        bound = step.get("max_iterations")
        suffix = len(f"[{bound if isinstance(bound, int) and bound > 0 else MAX_LOOP_ITERATIONS}]")
        for index, body_step in nested.steps:
            body_name = body_step.get("name")
            if not isinstance(body_name, str) or nested.index_of[body_name] != index:
                continue
            if body_name in self.index_of or body_name in self.body_names:
                self.add((*at, "body", index, "name"),
                         f"step name {body_name!r} is already used elsewhere in the workflow")
            self.body_names.add(body_name)
            if len(body_name) + suffix > STEP_RUN_NAME_CHARS:
                self.add((*at, "body", index, "name"),
                         f"a step in a loop's body may have at most {STEP_RUN_NAME_CHARS - suffix} "
                         "characters, to leave room for its iteration number")
        self.check_until((*at, "until"), step.get("until"), nested)

    def check_until(self, at: Parts, text: object, body: _Check) -> None:
        if not isinstance(text, str) or not text.strip():
            return
        try:
            used_roots = expression_roots(text)
            used_steps = referenced_steps(text)
        except ExpressionError as error:
            self.add(at, f"invalid expression: {error}")
            return
        for root in sorted(used_roots - body.roots):
            self.add(at, f"unknown variable {root!r}; available: {', '.join(sorted(body.roots))}")
        for step in sorted(used_steps):
            if step not in body.index_of:
                self.add(at, f"steps.{step} is not available: until reads only the loop's body "
                             f"steps ({', '.join(sorted(body.index_of))})")

    def check_step_budget(self, at: Parts, step: dict) -> None:
        """A step's max_cost_usd caps its model calls, within the run's own budget."""
        cap = step.get("max_cost_usd")
        if not _is_number(cap):
            return  # absent, null, or a type the format schema already reports
        body = step.get("item") if step.get("type") == "map" else step
        if isinstance(body, dict) and isinstance(body.get("type"), str) and not calls_model(body):
            self.add((*at, "max_cost_usd"), "this step calls no model, so it has no cost to cap")
        budget = self.doc.get("budget")
        run_cap = budget.get("max_cost_usd") if isinstance(budget, dict) else None
        if _is_number(run_cap) and cap > run_cap:
            self.add((*at, "max_cost_usd"),
                     f"{cap} is more than the run's budget.max_cost_usd ({run_cap})")

    def check_gate(self, at: Parts, step: dict, name) -> None:
        """What a gate approves, and the fields that only make sense for that (gates.py)."""
        if not isinstance(name, str):
            return
        by_name = self.steps_by_name()
        named = step.get("approves")
        if isinstance(named, str):
            problem = approves_problem(name, named, by_name, self.ancestors)
            if problem:
                self.add((*at, "approves"), problem)
                return
        binding = gate_binding(name, by_name, self.ancestors)
        if binding.kind == PROPOSAL and "risk_tier" in step:
            self.add((*at, "risk_tier"), f"this gate approves the proposal of {binding.source!r}, "
                     "whose tier its risk rules decide")
        editable = self.list_of_str(step.get("editable"))
        allowed = self.editable_params(binding, by_name)
        for position, param in enumerate(editable):
            if param is None or param in allowed:
                continue
            if binding.kind == CONTEXT:
                message = "this gate approves no action whose parameters could be edited"
            else:
                known = ", ".join(sorted(allowed)) or "none"
                message = f"{param!r} is not a parameter of the action {binding.source!r} performs (known: {known})"
            self.add((*at, "editable", position), message)
        remind, timeout = step.get("remind_before_s"), step.get("timeout_s", HUMAN_GATE_TIMEOUT_S)
        if _is_number(remind) and _is_number(timeout) and remind >= timeout:
            self.add((*at, "remind_before_s"),
                     f"remind_before_s ({remind}) must be less than timeout_s ({timeout})")

    def steps_by_name(self) -> dict[str, dict]:
        return {step["name"]: step for index, step in self.steps
                if isinstance(step.get("name"), str) and self.index_of[step["name"]] == index}

    def editable_params(self, binding, by_name: dict[str, dict]) -> set[str]:
        source = by_name.get(binding.source) if binding.source else None
        if binding.kind == STEP and source is not None:
            schema = self.tools.get(source.get("tool")) if isinstance(source.get("tool"), str) else None
            declared = set(source.get("params") or {}) if isinstance(source.get("params"), dict) else set()
            properties = (schema or {}).get("properties") if isinstance(schema, dict) else None
            return declared | set(properties or {})
        if binding.kind == PROPOSAL and source is not None:
            names: set[str] = set()
            for action in (source.get("proposal") or {}).get("actions") or []:
                schema = action.get("params_schema") if isinstance(action, dict) else None
                if isinstance(schema, dict) and isinstance(schema.get("properties"), dict):
                    names |= set(schema["properties"])
            return names
        return set()

    def check_body(self, at: Parts, body: dict, name, upstream, roots) -> None:
        """The fields an agent or tool step shares with an agent or tool map item."""
        if body.get("type") == "agent":
            self.check_agent(at, body, name, upstream, roots)
        elif body.get("type") == "tool":
            self.check_tool(at, body, name, upstream, roots)

    def check_fallback(self, index: int, step: dict, name, upstream) -> None:
        """A fallback the scheduler can run: it names another step, which has not already run
        when this one fails, rescues no other step, has no fallback of its own if it is one,
        and does not wait for this step (a failed step counts as pending until its fallback
        has ended, so that fallback would wait forever)."""
        fallback = step.get("fallback")
        if not isinstance(fallback, str):
            return
        at: Parts = ("steps", index, "fallback")
        if fallback not in self.index_of:
            self.add(at, f"unknown step {fallback!r} as fallback")
        elif fallback == name:
            self.add(at, "a step cannot be its own fallback")
        elif fallback in upstream:
            self.add(
                at,
                f"fallback {fallback!r} is an ancestor of {name!r}; it has already run when {name!r} fails",
            )
        elif name is None or self.index_of[name] != index or name in self.in_fallback_cycle:
            return  # a duplicate name, reported as such; a cycle, reported at its first step
        elif (first := self.graph.primary_of[fallback]) != name:
            # The scheduler runs a fallback for one primary only (its `fallback_for`).
            self.add(
                at,
                f"{fallback!r} is already the fallback of {first!r} (steps[{self.index_of[first]}]); "
                "a step can be the fallback of one step only",
            )
        elif (primary := self.graph.primary_of.get(name)) is not None:
            # The scheduler rescues `primary` with this step's own result, never with its
            # fallback's: that fallback would run, but never stand in for `primary`.
            self.add(
                at,
                f"{name!r} is the fallback of {primary!r}, so it cannot have a fallback of its own: "
                f"if {name!r} fails too, {primary!r} fails even when {fallback!r} completes",
            )
        elif (waits := self.graph.fallback_waits_for(name)) is not None:
            way, failing = waits
            self.add(at, f"fallback {fallback!r} depends on its primary {name!r} "
                         f"({self.fallback_way(way)}), so it could never run{_if_failing(failing)}")

    def fallback_way(self, way: list[str]) -> str:
        """`fb -> b -> a`, naming the primary of each fallback met on the way."""
        shown = [way[0]]
        for position in range(1, len(way)):
            step, primary = way[position], self.graph.primary_of.get(way[position])
            neighbours = {way[position - 1], *way[position + 1 : position + 2]}
            shown.append(f"{step} (fallback of {primary})" if primary in neighbours else step)
        return " -> ".join(shown)

    def check_retry(self, at: Parts, retry: object) -> None:
        if not isinstance(retry, dict):
            return
        base, cap = retry.get("base_s", 2), retry.get("max_s", 60)
        if _is_number(base) and _is_number(cap) and cap < base:
            self.add((*at, "retry", "max_s"), f"max_s ({cap}) must be >= base_s ({base})")

    def check_agent(self, at: Parts, step: dict, name, upstream, roots) -> None:
        self.check_model_call(at, step, name, upstream, roots)
        proposal = step.get("proposal")
        if isinstance(proposal, dict):
            self.check_proposal((*at, "proposal"), proposal, name, upstream)
        script = step.get("script")
        if not isinstance(script, list):
            return
        if isinstance(proposal, dict):
            check = self.proposal_checker(proposal)
        else:
            output_schema = step.get("output_schema")
            validator = (
                Draft202012Validator(output_schema) if is_valid_schema(output_schema) else None
            )
            check = (lambda value: _schema_errors(validator, value)) if validator else None
        for position, reply in enumerate(script):
            if not isinstance(reply, dict):
                continue
            reply_at = (*at, "script", position)
            self.check_expression((*reply_at, "when"), reply.get("when"), name, upstream, roots)
            if check is None or "error" in reply or "output" not in reply:
                continue
            for error in check(reply["output"]):
                if isinstance(error, str):
                    self.add((*reply_at, "output"), f"scripted proposal is not valid: {error}")
                else:
                    self.add(
                        (*reply_at, "output", *error.absolute_path),
                        f"scripted output does not match output_schema: {error.message}",
                    )

    def check_model_call(self, at: Parts, step: dict, name, upstream, roots) -> None:
        """The model and prompt templates of an agent step or an llm router."""
        model = step.get("model")
        if isinstance(model, str) and model not in self.models:
            self.add((*at, "model"), f"unknown model {model!r}; {_known('model', self.models)}")
        for field in ("prompt", "system"):
            self.check_template((*at, field), step.get(field), name, upstream, roots)

    def check_proposal(self, at: Parts, proposal: dict, name, upstream) -> None:
        actions = proposal.get("actions")
        seen: set[str] = set()
        for position, action in enumerate(actions if isinstance(actions, list) else []):
            if not isinstance(action, dict):
                continue
            action_at = (*at, "actions", position)
            kind = action.get("type")
            if isinstance(kind, str):
                if kind in seen:
                    self.add((*action_at, "type"), f"duplicate action type {kind!r}")
                seen.add(kind)
            params_schema = action.get("params_schema")
            self.check_schema_field((*action_at, "params_schema"), params_schema)
            declared = (
                params_schema.get("properties") if isinstance(params_schema, dict) else None
            )
            declared = declared if isinstance(declared, dict) else {}
            if isinstance(params_schema, dict) and params_schema.get("type") != "object":
                self.add((*action_at, "params_schema"), "params_schema must have type: object")
            risk = action.get("risk")
            if not isinstance(risk, dict):
                continue
            for rule_name in ("amount", "recipient"):
                rule = risk.get(rule_name)
                param = rule.get("param") if isinstance(rule, dict) else None
                if isinstance(param, str) and param not in declared:
                    self.add(
                        (*action_at, "risk", rule_name, "param"),
                        f"param {param!r} is not declared in params_schema.properties",
                    )
            rules = risk.get("rules")
            for index, rule in enumerate(rules if isinstance(rules, list) else []):
                if isinstance(rule, dict):
                    self.check_expression(
                        (*action_at, "risk", "rules", index, "when"),
                        rule.get("when"),
                        name,
                        upstream,
                        RISK_RULE_ROOTS,
                    )

    @staticmethod
    def proposal_checker(proposal: dict) -> Callable[[object], list[str]] | None:
        """Checks a scripted reply the way the agent executor checks a model's proposal."""
        actions = proposal.get("actions")
        if not isinstance(actions, list) or not all(
            isinstance(a, dict)
            and isinstance(a.get("type"), str)
            and isinstance(a.get("params_schema"), dict)
            and is_valid_schema(a["params_schema"])
            for a in actions
        ):
            return None

        def check(value: object) -> list[str]:
            try:
                return proposal_problems(proposal, normalize_proposal(proposal, value))
            except ValueError as error:
                return [str(error)]
            except Exception:  # an unresolvable $ref in a params schema: reported elsewhere
                return []

        return check

    def check_tool(self, at: Parts, step: dict, name, upstream, roots) -> None:
        self.check_tool_call(
            at, step.get("tool"), step.get("params"), "params", name, upstream, roots
        )
        compensate = step.get("compensate")
        if isinstance(compensate, dict):
            # A compensation undoes this step, so it may read this step's own output.
            self.check_tool_call(
                (*at, "compensate"),
                compensate.get("tool"),
                compensate.get("params"),
                "params",
                name,
                upstream | ({name} if name else set()),
                roots,
            )

    def check_tool_call(self, at: Parts, tool, params, field, name, upstream, roots) -> None:
        self.check_templates_in((*at, field), params, name, upstream, roots)
        if not isinstance(tool, str):
            return
        if tool not in self.tools:
            self.add((*at, "tool"), f"unknown tool {tool!r}; {_known('tool', self.tools)}")
            return
        self.check_against_schema(
            (*at, field), params if params is not None else {}, self.tools[tool], f"tool {tool!r}"
        )
        if self.egress is not None and isinstance(params, dict):
            for parts, message in self.egress(tool, params):
                self.add((*at, field, *parts), message)
        if self.tool_params is not None and isinstance(params, dict):
            for parts, message in self.tool_params(tool, params):
                self.add((*at, field, *parts), message)

    def check_sub_workflow(self, at: Parts, step: dict, name, upstream) -> None:
        self.check_templates_in((*at, "input"), step.get("input"), name, upstream, self.roots)
        workflow = step.get("workflow")
        if not isinstance(workflow, str):
            return
        if workflow == self.doc.get("name"):
            self.add(
                (*at, "workflow"), f"workflow {workflow!r} cannot run itself as a sub-workflow"
            )
            return
        child_schema = self.workflows(workflow)
        if child_schema is None:
            self.add((*at, "workflow"), f"unknown workflow {workflow!r}")
            return
        child_input = step.get("input")
        self.check_against_schema(
            (*at, "input"),
            child_input if child_input is not None else {},
            child_schema,
            f"workflow {workflow!r}",
        )

    def check_against_schema(self, at: Parts, value: object, schema: object, owner: str) -> None:
        """Validate literal `value` now; with templates inside, only its required keys."""
        if not isinstance(value, dict) or not is_valid_schema(schema):
            return
        if contains_template(value):
            required = schema.get("required") if isinstance(schema, dict) else None
            for key in required if isinstance(required, list) else []:
                if key not in value:
                    self.add(at, f"missing {key!r}, required by {owner}")
            return
        for error in _schema_errors(Draft202012Validator(schema), value):
            self.add((*at, *error.absolute_path), f"not accepted by {owner}: {error.message}")

    def check_router(self, at: Parts, step: dict, name, upstream) -> None:
        strategy = step.get("strategy", "rules")
        if strategy == "score":
            self.check_expression((*at, "score"), step.get("score"), name, upstream, self.roots)
        elif strategy == "llm":
            self.check_model_call(at, step, name, upstream, self.roots)
            script = step.get("script")
            for position, reply in enumerate(script if isinstance(script, list) else []):
                if isinstance(reply, dict):
                    self.check_expression(
                        (*at, "script", position, "when"), reply.get("when"), name, upstream,
                        self.roots,
                    )
        seen: dict[str, Parts] = {}
        for route_name, then, route_at in self.router_branches(step, at):
            route_name_at = (*route_at, "name")
            if route_name in seen:
                self.add(route_name_at, f"duplicate route name {route_name!r}")
            seen.setdefault(route_name, route_name_at)
            route = self.value_at(route_at)
            if strategy == "rules" and isinstance(route, dict):
                self.check_expression(
                    (*route_at, "when"), route.get("when"), name, upstream, self.roots
                )
            for position, target in enumerate(then):
                target_at = (*route_at, "then", position)
                if target is None:
                    continue
                if target not in self.index_of:
                    self.add(target_at, f"unknown step {target!r} in then")
                    continue
                target_step = self.step_named(target)
                if name and name not in self.list_of_str(target_step.get("after")):
                    self.add(
                        target_at,
                        f"step {target!r} is routed to by {name!r} but does not list {name!r} in its after",
                    )

    def check_map(self, at: Parts, step: dict, name, upstream) -> None:
        # `over` produces the items, so `item` and `index` do not exist yet.
        self.check_expression((*at, "over"), step.get("over"), name, upstream, self.roots)
        item = step.get("item")
        if not isinstance(item, dict):
            return
        item_at = (*at, "item")
        item_roots = self.roots | MAP_ITEM_ROOTS
        if name:
            self.item_samples[name] = self.sample_items(step.get("over"), name, upstream)
        self.check_retry(item_at, item.get("retry"))
        self.check_schema_field((*item_at, "output_schema"), item.get("output_schema"))
        self.check_step_input_schema(item_at, item.get("input_schema"), name, upstream)
        self.check_body(item_at, item, name, upstream, item_roots)

    # --- expressions and templates -------------------------------------------------------

    def check_expression(self, at: Parts, text: object, name, upstream, roots) -> None:
        if not isinstance(text, str) or not text.strip():
            return
        try:
            used_roots = expression_roots(text)
            used_steps = referenced_steps(text)
        except ExpressionError as error:
            self.add(at, f"invalid expression: {error}")
            return
        before = len(self.log)
        for root in sorted(used_roots - roots):
            self.add(at, f"unknown variable {root!r}; available: {', '.join(sorted(roots))}")
        for step in sorted(used_steps):
            self.check_step_reference(at, step, name, upstream)
        if len(self.log) == before:
            self.try_expression(at, text, name, upstream, roots)

    def check_template(self, at: Parts, text: object, name, upstream, roots) -> None:
        if not isinstance(text, str) or not is_template(text):
            return
        try:
            used_names = template_names(text)
            used_steps = template_step_references(text)
        except TemplateError as error:
            self.add(at, f"invalid template: {error}")
            return
        before = len(self.log)
        for root in sorted(used_names - roots):
            self.add(
                at, f"unknown template variable {root!r}; available: {', '.join(sorted(roots))}"
            )
        for step in sorted(used_steps):
            self.check_step_reference(at, step, name, upstream)
        if len(self.log) == before:
            self.try_template(at, text, name, upstream, roots)

    # --- what saves, runs: templates and expressions tried on data of the declared shapes ---

    def sample_contexts(self, name, upstream, roots) -> list[tuple[bool, dict]]:
        """(full?, context) for the two variants described in `shapes.py`.

        In the minimal variant an ancestor that may not have completed when `name` runs
        (reached through `join: any`) is skipped with no output, and one with a fallback
        has the fallback's output.
        """
        sure = self.completed.get(name, frozenset()) if name else frozenset()
        contexts = []
        for full in (True, False):
            steps = {}
            for ancestor in sorted(upstream):
                if ancestor not in self.index_of:
                    continue
                spec = self.step_named(ancestor)
                if not full and ancestor not in sure and ancestor != name:
                    steps[ancestor] = {"state": "skipped", "output": None}
                    continue
                producer = spec
                fallback = spec.get("fallback")
                if not full and isinstance(fallback, str) and fallback in self.index_of:
                    producer = self.step_named(fallback)
                steps[ancestor] = {
                    "state": "completed",
                    "output": _sample(_output_schema_of(producer), full),
                }
            context = {"input": _sample(self.doc.get("input_schema"), full), "steps": steps}
            if "item" in roots:
                items = self.item_samples.get(name, (UNKNOWN, UNKNOWN))
                context["item"] = items[0] if full else items[1]
                context["index"] = 0
            if "proposal" in roots:
                context["proposal"] = UNKNOWN
            if "iteration" in roots:
                context["iteration"] = {"number": 1, "input": UNKNOWN, "previous": UNKNOWN}
            contexts.append((full, context))
        return contexts

    def sample_items(self, over: object, name: str, upstream) -> tuple[object, object]:
        """One element of `over` per variant (unknown when it cannot be worked out)."""
        found = []
        for _full, context in self.sample_contexts(name, upstream, self.roots):
            try:
                items = evaluate_expression(over, context) if isinstance(over, str) else None
            except ExpressionError:
                items = None
            found.append(items[0] if isinstance(items, list) and items else UNKNOWN)
        return found[0], found[1]

    def runs_in(self, at: Parts, name, context: dict) -> bool:
        """Whether what is at `at` is used in `context`: the step's own `when` always is;
        everything else only when that `when` holds (a step whose `when` is false or
        cannot be evaluated renders nothing)."""
        if not name or len(at) == 3 and at[0] == "steps" and at[2] == "when":
            return True
        when = self.step_named(name).get("when")
        if not isinstance(when, str) or not when.strip():
            return True
        try:
            return evaluate_expression(when, context) is True
        except ExpressionError:
            return False

    def try_template(self, at: Parts, text: str, name, upstream, roots) -> None:
        for full, context in self.sample_contexts(name, upstream, roots):
            if not self.runs_in(at, name, context):
                continue
            try:
                render_template(text, context)
            except TemplateLimitExceeded as error:
                self.add(at, f"template is too costly: {error}")
            except TemplateUnsafe as error:
                self.add(at, str(error))
            except TemplateUndefined as error:
                self.add(at, _shape_problem("template", full, error))
            except TemplateError:
                continue  # depends on the values, not on the shapes
            else:
                continue
            return

    def try_expression(self, at: Parts, text: str, name, upstream, roots) -> None:
        for full, context in self.sample_contexts(name, upstream, roots):
            if not self.runs_in(at, name, context):
                continue
            try:
                evaluate_expression(text, context)
            except ExpressionLimitExceeded as error:
                self.add(at, f"expression is too costly: {error}")
            except ExpressionError as error:
                if not any(marker in str(error) for marker in _MISSING_READ):
                    continue  # depends on the values, not on the shapes
                self.add(at, _shape_problem("expression", full, error))
            else:
                continue
            return

    def check_templates_in(self, at: Parts, value: object, name, upstream, roots) -> None:
        if isinstance(value, str):
            self.check_template(at, value, name, upstream, roots)
        elif isinstance(value, dict):
            for key, item in value.items():
                self.check_templates_in((*at, key), item, name, upstream, roots)
        elif isinstance(value, list):
            for position, item in enumerate(value):
                self.check_templates_in((*at, position), item, name, upstream, roots)

    def check_step_reference(self, at: Parts, step: str, name, upstream) -> None:
        if step not in self.index_of:
            self.add(at, f"unknown step {step!r} referenced as steps.{step}")
        elif step == name and step not in upstream:
            self.add(at, f"step {name!r} cannot read its own output here")
        elif step not in upstream:
            self.add(
                at,
                f"steps.{step} is not available: {step!r} is not an ancestor of {name!r} (add it to after)",
            )

    # --- embedded schemas ------------------------------------------------------------

    def check_schema_field(self, at: Parts, schema: object) -> None:
        if isinstance(schema, dict | bool):
            for parts, message in schema_problems(schema, at):
                self.add(parts, message)

    def check_step_input_schema(self, at: Parts, schema: object, name, upstream) -> None:
        at = (*at, "input_schema")
        self.check_schema_field(at, schema)
        if not isinstance(schema, dict):
            return
        if schema.get("type", "object") != "object":
            self.add((*at, "type"), "a step input_schema must have type: object")
        properties = schema.get("properties")
        if not isinstance(properties, dict):
            return
        for producer, wanted in properties.items():
            prop_at = (*at, "properties", producer)
            if producer not in self.index_of:
                self.add(prop_at, f"unknown step {producer!r}")
                continue
            if producer not in upstream:
                self.add(prop_at, f"step {producer!r} is not an ancestor of {name!r}")
                continue
            produced = _output_schema_of(self.step_named(producer))
            if not is_valid_schema(produced) or not is_valid_schema(wanted):
                continue
            reason = schema_accepts(wanted, produced)
            if reason:
                self.add(prop_at, f"step {producer!r} output is not accepted: {reason}")

    def check_audit(self) -> None:
        """A sensitive path must name a step of this workflow: a typo would redact nothing."""
        audit = self.doc.get("audit")
        paths = audit.get("sensitive") if isinstance(audit, dict) else None
        for position, path in enumerate(self.list_of_str(paths)):
            parts = (path or "").split(".")
            if len(parts) > 2 and parts[0] == "steps" and parts[1] != "*" \
                    and parts[1] not in self.index_of:
                self.add(("audit", "sensitive", position), f"unknown step {parts[1]!r} in {path!r}")

    # --- reading the document safely --------------------------------------------------

    def step_named(self, name: str) -> dict:
        index = self.index_of[name]
        return self.doc["steps"][index]

    def value_at(self, parts: Parts) -> Any:
        node: Any = self.doc
        for part in parts:
            node = node[part]
        return node

    def router_branches(self, step: dict, at: Parts = ()) -> Iterator[tuple[str, list, Parts]]:
        """(route name, then step names, path) for each well-formed route and the default.

        Names in `then` that are not strings come back as None so positions stay true.
        """
        routes = step.get("routes")
        candidates = [
            ((*at, "routes", position), route)
            for position, route in enumerate(routes if isinstance(routes, list) else [])
        ]
        candidates.append(((*at, "default"), step.get("default")))
        for route_at, route in candidates:
            if isinstance(route, dict) and isinstance(route.get("name"), str):
                yield route["name"], self.list_of_str(route.get("then")), route_at

    @staticmethod
    def list_of_str(value: object) -> list[str | None]:
        if not isinstance(value, list):
            return []
        return [item if isinstance(item, str) else None for item in value]


def _output_schema_of(step: dict) -> object:
    """What a step declares of its output: its output_schema, or a kind's own shape."""
    if step.get("type") == "human_input":
        return input_output_schema(step)
    return step.get("output_schema")


def _sample(schema: object, full: bool) -> object:
    return sample(schema, full=full) if is_valid_schema(schema) else UNKNOWN


def _shape_problem(kind: str, full: bool, error: Exception) -> str:
    detail = str(error).removeprefix("undefined variable: ")
    if full:
        return (
            f"{kind} reads something the declared shapes do not have ({detail}): check the "
            "name, or declare it in the producing step's output_schema or the input_schema"
        )
    return (
        f"{kind} reads something that may be absent when the step runs ({detail}): a "
        "property that is not required, a nullable value, an empty list, or a step that may "
        "not have completed; make it required, or guard it (Jinja: `is defined`, "
        "`| default(...)`; CEL: `has(...)`)"
    )


def _schema_errors(validator: Draft202012Validator, value: object) -> list:
    try:
        return list(validator.iter_errors(value))
    except Exception:  # an unresolvable $ref in a user schema: reported by the schema check
        return []


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
