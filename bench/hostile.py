"""Hostile definitions and inputs: the worst time and peak memory of each refusal.

`python bench/hostile.py [--repeat N]` prints one line per case: what the web process does with
a hostile body before it answers (parse the text, then every definition check the validate and
save endpoints run, no database needed), what a worker does rendering a hostile template with
run data, and the call-graph search over a long chain. tests/definitions/test_hostile_properties.py
asserts that each is refused, stores nothing and builds nothing large; the times are here, not
asserted there. docs/limits.md lists the limits these cases hit.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _definition(**step_fields) -> str:
    step = {"name": "a", "type": "tool", "tool": "core.echo", **step_fields}
    return json.dumps({"name": "hostile", "input_schema": {"type": "object"}, "steps": [step]})


DEFINITIONS = {
    "format fields x400 (str.format)": _definition(params={"x": '{{ ("{0:>1000000}" * 400).format(1) }}'}),
    "format fields x400 (%)": _definition(params={"x": '{{ ("%1000000d" * 400) % ((1,) * 400) }}'}),
    "format fields x400 (format filter)": _definition(
        params={"x": '{{ ("%1000000d" * 400) | format(*((1,) * 400)) }}'}),
    "1M references to a 1M string, printed": _definition(
        params={"x": '{% set s = "x" * 1000000 %}{{ [s] * 1000000 }}'}),
    "repetition 'ab' * 10**12": _definition(params={"x": "{{ 'ab' * 1000000000000 }}"}),
    "loops 100000 x 100000": _definition(
        params={"x": "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"}),
    "template parentheses x5000": _definition(params={"x": "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}"}),
    "CEL parentheses x1500": _definition(when="(" * 1500 + "true" + ")" * 1500),
    "CEL negations x4000": _definition(when="!" * 4000 + "true"),
    "CEL deepest allowed": _definition(when="(" * 18 + "true" + ")" * 18),
    "JSON nested 20000": '{"name": "x", "input_schema": {"type": "object"}, "steps": '
                         + "[" * 20000 + "]" * 20000 + "}",
    "lone surrogate in description": json.dumps(
        {"name": "x", "description": "\ud800", "input_schema": {"type": "object"},
         "steps": [{"name": "a", "type": "tool", "tool": "core.echo"}]}),
}
YAML = {
    "YAML nested 20000": "name: x\ninput_schema: {type: object}\nsteps: " + "[" * 20000 + "]" * 20000,
}
RENDERS = {  # what a worker renders with run data the save-time samples did not have
    "run-time format fields x400": ("{{ (input.f * 400).format(1) }}", {"f": "{0:>1000000}"}),
    "run-time % fields x400": ("{{ (input.f * 400) % ((1,) * 400) }}", {"f": "%1000000d"}),
    "run-time join of shared references": ("{{ ([[input.s]] * 1000) | join }}", {"s": "x" * 1000000}),
}


def _time_and_peak(fn, repeat: int) -> tuple[float, float, str]:
    worst = 0.0
    outcome = ""
    for _ in range(repeat):
        started = time.perf_counter()
        outcome = fn()
        worst = max(worst, time.perf_counter() - started)
    tracemalloc.start()
    try:
        fn()
        peak = tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()
    return worst * 1000, peak, outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator.settings")
    import django

    django.setup()
    from django.conf import settings

    from orchestrator.engine.definitions import (
        DefinitionInvalid,
        TemplateError,
        parse_definition_text,
        validate_definition,
    )
    from orchestrator.engine.definitions.calls import call_cycle
    from orchestrator.engine.definitions.loader import parse_json_text
    from orchestrator.engine.definitions.templates import render_template
    from orchestrator.integrations.tools.registry import tool_param_schemas

    tools = tool_param_schemas()

    def check(text: str, content_type: str) -> str:
        try:
            if content_type == "json":
                doc = parse_json_text(text, what="JSON")
            else:
                doc = parse_definition_text(text, content_type="application/yaml")
        except DefinitionInvalid as refused:
            return "refused: " + refused.problems[0].message[:70]
        problems = validate_definition(doc, tools=tools, models=settings.STEPWISE_MODELS.keys(),
                                       workflows=lambda name: None)
        return ("refused: " + f"{problems[0].path}: {problems[0].message}"[:70]) if problems \
            else "ACCEPTED"

    def render(text: str, data: dict) -> str:
        try:
            render_template(text, {"input": data, "steps": {}})
        except TemplateError as refused:
            return "step fails: " + str(refused)[:66]
        return "RENDERED"

    chain = {f"w{i}": [f"w{i + 1}"] for i in range(5000)}
    chain["w5000"] = ["w0"]
    cases = [(name, lambda t=text: check(t, "json")) for name, text in DEFINITIONS.items()]
    cases += [(name, lambda t=text: check(t, "yaml")) for name, text in YAML.items()]
    cases += [(name, lambda t=text, d=data: render(t, d))
              for name, (text, data) in RENDERS.items()]

    def cycle() -> str:
        return f"chain of {len(call_cycle('w0', ['w1'], lambda n: chain.get(n, [])))}"

    cases.append(("call cycle through 5000 workflows", cycle))

    print(f"{'case':42} {'worst ms':>9} {'peak MB':>8}  outcome")
    for name, fn in cases:
        worst, peak, outcome = _time_and_peak(fn, args.repeat)
        print(f"{name:42} {worst:9.1f} {peak:8.1f}  {outcome}", flush=True)


if __name__ == "__main__":
    main()
