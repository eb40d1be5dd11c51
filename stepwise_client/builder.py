"""Workflows written in Python: a small typed builder that produces the definition a YAML file
would — a plain dict, validated, versioned and run exactly like one (there is no second engine).

    from stepwise_client.builder import Workflow

    wf = Workflow("support-reply", input_schema={"type": "object", "required": ["body"], ...})
    classify = wf.agent("classify", model="fast", prompt="Classify: {{ input.body }}",
                        output_schema={...})
    wf.tool("send", tool="email.send", after=[classify], params={"to": "{{ input.email }}"})
    refine = wf.loop("refine", max_iterations=3, until="steps.critique.output.approved")
    draft = refine.agent("draft", model="deep", prompt="...", output_schema={...})
    refine.agent("critique", model="fast", after=[draft], prompt="...", output_schema={...})
    definition = wf.to_dict()     # what yaml.safe_load(the same workflow's YAML) returns

Every keyword is a field of the definition format (docs/definitions.md); a keyword left out is
left out of the dict, so the server fills the same defaults it fills for YAML. Save one with
`Stepwise.save_workflow(wf)`, `python -m stepwise_client save module:attr` or
`manage.py workflow_save_py module:attr`. It imports nothing of the server, like the client.
"""
from __future__ import annotations

import copy
import importlib
import importlib.util
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


class Step:
    """A step added to a workflow (or to a loop's body): pass it in another step's `after`."""

    def __init__(self, fields: dict[str, Any]):
        self.fields = fields

    @property
    def name(self) -> str:
        return self.fields["name"]

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.fields)


def _names(after: Iterable[str | Step]) -> list[str]:
    return [a.name if isinstance(a, Step) else a for a in after]


def _step(name: str, kind: str, *, after: Iterable[str | Step] | None, fields: Mapping[str, Any]) -> dict:
    """Only what was given: a keyword left at None is absent, as a field left out of YAML."""
    step: dict[str, Any] = {"name": name, "type": kind}
    if after is not None:
        step["after"] = _names(after)
    step.update((key, value) for key, value in fields.items() if value is not None)
    return step


class _Steps:
    """The step kinds a workflow and a loop's body share (agent, tool, router)."""

    def __init__(self) -> None:
        self.steps: list[Step] = []

    def _add(self, step: Step | dict) -> Step:
        step = step if isinstance(step, Step) else Step(step)
        if any(s.name == step.name for s in self.steps):
            raise ValueError(f"step {step.name!r} is already defined")
        self.steps.append(step)
        return step

    def agent(self, name: str, *, model: str, prompt: str, output_schema: dict | bool | None = None,
              after: Iterable[str | Step] | None = None, when: str | None = None,
              timeout_s: int | None = None, retry: dict | None = None,
              script: list[dict] | None = None, **fields: Any) -> Step:
        """An agent step: a model call whose output must match `output_schema`."""
        return self._add(_step(name, "agent", after=after, fields={
            "model": model, "prompt": prompt, "output_schema": output_schema, "when": when,
            "timeout_s": timeout_s, "retry": retry, "script": script, **fields}))

    def tool(self, name: str, *, tool: str, params: dict | None = None,
             after: Iterable[str | Step] | None = None, when: str | None = None,
             side_effect: bool | None = None, timeout_s: int | None = None,
             retry: dict | None = None, **fields: Any) -> Step:
        """A tool step: a registered tool called with templated `params`."""
        return self._add(_step(name, "tool", after=after, fields={
            "tool": tool, "params": params, "when": when, "side_effect": side_effect,
            "timeout_s": timeout_s, "retry": retry, **fields}))

    def router(self, name: str, *, routes: list[dict], default: dict, strategy: str | None = None,
               score: str | None = None, after: Iterable[str | Step] | None = None,
               **fields: Any) -> Step:
        """A router: picks one route (rules, score threshold or a model); the others are skipped."""
        return self._add(_step(name, "router", after=after, fields={
            "strategy": strategy, "score": score, "routes": routes, "default": default, **fields}))


class Loop(Step, _Steps):
    """A loop step: add its body with `.agent`, `.tool` and `.router`."""

    def __init__(self, fields: dict[str, Any]):
        Step.__init__(self, fields)
        _Steps.__init__(self)

    def to_dict(self) -> dict[str, Any]:
        return {**copy.deepcopy(self.fields), "body": [s.to_dict() for s in self.steps]}


class Workflow(_Steps):
    """A workflow definition under construction; `to_dict()` is the definition."""

    def __init__(self, name: str, *, input_schema: dict | bool, description: str | None = None,
                 budget: dict | None = None, on_error: str | None = None,
                 max_parallel: int | None = None, audit: dict | None = None,
                 concurrency: dict | None = None):
        super().__init__()
        self.header = {key: value for key, value in {
            "name": name, "description": description, "input_schema": input_schema,
            "budget": budget, "on_error": on_error, "max_parallel": max_parallel,
            "concurrency": concurrency, "audit": audit,
        }.items() if value is not None}

    @property
    def name(self) -> str:
        return self.header["name"]

    def map(self, name: str, *, over: str, item: dict, merge: str | None = None,
            after: Iterable[str | Step] | None = None, **fields: Any) -> Step:
        """A map step: `item` (an agent or tool body) runs once per element of `over`."""
        return self._add(_step(name, "map", after=after, fields={
            "over": over, "merge": merge, "item": item, **fields}))

    def human_gate(self, name: str, *, approvers: str, after: Iterable[str | Step] | None = None,
                   instructions: str | None = None, timeout_s: int | None = None,
                   **fields: Any) -> Step:
        """A human gate: the run waits until a member of `approvers` decides."""
        return self._add(_step(name, "human_gate", after=after, fields={
            "approvers": approvers, "instructions": instructions, "timeout_s": timeout_s, **fields}))

    def sub_workflow(self, name: str, *, workflow: str, input: dict | None = None,
                     after: Iterable[str | Step] | None = None, **fields: Any) -> Step:
        """A child run of another saved workflow."""
        return self._add(_step(name, "sub_workflow", after=after, fields={
            "workflow": workflow, "input": input, **fields}))

    def sleep(self, name: str, *, for_s: int | None = None, until: str | None = None,
              timezone: str | None = None, after: Iterable[str | Step] | None = None,
              **fields: Any) -> Step:
        """A sleep: the run waits `for_s` seconds, or `until` a time (a template, read in
        `timezone`), holding no worker."""
        return self._add(_step(name, "sleep", after=after, fields={
            "for_s": for_s, "until": until, "timezone": timezone, **fields}))

    def human_input(self, name: str, *, group: str, form: dict, assignee: str | None = None,
                    instructions: str | None = None, evidence: dict[str, str] | None = None,
                    deadline_s: int | None = None, escalate_to: str | None = None,
                    escalate_after_s: int | None = None, on_timeout: str | None = None,
                    allow_abstain: bool | None = None, separation_of_duties: bool | None = None,
                    after: Iterable[str | Step] | None = None, **fields: Any) -> Step:
        """A human input: the run waits for a person of `group` (or `assignee`) to fill in
        `form` (a JSON Schema of flat fields), shown `evidence` (templates over the run).
        Later steps read `steps.<name>.output.answer`, `.answered_by` and `.abstained`."""
        return self._add(_step(name, "human_input", after=after, fields={
            "group": group, "form": form, "assignee": assignee, "instructions": instructions,
            "evidence": evidence, "deadline_s": deadline_s, "escalate_to": escalate_to,
            "escalate_after_s": escalate_after_s, "on_timeout": on_timeout,
            "allow_abstain": allow_abstain, "separation_of_duties": separation_of_duties,
            **fields}))

    def wait(self, name: str, *, signal: str, schema: dict | None = None,
             correlation_key: str | None = None, timeout_s: int | None = None,
             on_timeout: str | None = None, early_signals: str | None = None,
             after: Iterable[str | Step] | None = None, **fields: Any) -> Step:
        """A wait: the run waits, holding no worker, for the signal `signal` (its payload,
        checked against `schema`, is the step's output), at most `timeout_s` seconds;
        `on_timeout` is fail, continue or a step to route to."""
        return self._add(_step(name, "wait", after=after, fields={
            "signal": signal, "schema": schema, "correlation_key": correlation_key,
            "timeout_s": timeout_s, "on_timeout": on_timeout, "early_signals": early_signals,
            **fields}))

    def loop(self, name: str, *, max_iterations: int, until: str, input: dict | None = None,
             after: Iterable[str | Step] | None = None, **fields: Any) -> Loop:
        """A loop: its body (added on the returned Loop) runs until `until` holds, at most
        `max_iterations` times."""
        step = Loop(_step(name, "loop", after=after, fields={
            "max_iterations": max_iterations, "input": input, "until": until, **fields}))
        self._add(step)
        return step

    def to_dict(self) -> dict[str, Any]:
        return {**copy.deepcopy(self.header), "steps": [s.to_dict() for s in self.steps]}


def definition_of(value: object) -> dict:
    """The definition dict of a Workflow, of anything with `to_dict()`, or of a dict.

    Raises TypeError for anything else."""
    if isinstance(value, Mapping):
        return copy.deepcopy(dict(value))
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        result = to_dict()
        if isinstance(result, Mapping):
            return dict(result)
    raise TypeError(f"not a workflow: {type(value).__name__} (a Workflow or a dict is)")


def load_definition(reference: str) -> dict:
    """Import `module:attr` (a dotted module, or a path to a .py file) and return its definition.

    Raises ValueError for a reference without `:attr`, ImportError, AttributeError, TypeError.
    """
    target, colon, attr = reference.rpartition(":")
    if not colon or not target or not attr:
        raise ValueError(f"{reference!r}: expected module:attribute (or path/to/file.py:attribute)")
    if target.endswith(".py"):
        path = Path(target).resolve()
        spec = importlib.util.spec_from_file_location(f"_stepwise_workflow_{path.stem}", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {target}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    return definition_of(getattr(module, attr))
