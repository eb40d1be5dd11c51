"""Hostile definitions and inputs, generated (issue 41): whatever a member or an editor posts to
validate, save or start, the answer is below 500, a refusal stores nothing, and the web process
builds nothing large while answering. How long each kind takes at worst is a figure printed by
`python bench/hostile.py`, not an assertion here."""
import itertools
import json
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role, Run, Workflow, WorkflowVersion
from tests.conftest import client_for
from tests.factories import SETUP, example_definition, member

WORKFLOWS = "/api/v1/workflows/"
VALIDATE = "/api/v1/workflows/validate/"
RUNS = "/api/v1/workflows/support-reply/runs/"
# Generous: an unchecked amplification below builds hundreds of MB to TB; an answer builds a
# few MB (the largest allowed value is 1 MiB of text).
MEMORY_MB = 96
EXAMPLES = settings(max_examples=10, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
_names = itertools.count()

# --- what is generated ---------------------------------------------------------------------------

surrogate = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
invalid_text = st.builds(lambda a, s, b: a + s + b, st.text(max_size=4), surrogate,
                         st.text(max_size=4))
# Each field or item within the 1 MiB limit (up to 1,000,000), their total past it.
count = st.integers(2, 3_000)
amplified = st.tuples(st.integers(10_000, 1_000_000), count).map(
    lambda pair: (max(pair[0], 1_100_000 // pair[1] + 1), pair[1]))


def each(pattern: str):
    return amplified.map(lambda pair: pattern.format(w=pair[0], n=pair[1]))


templates = st.one_of(
    each('{{{{ ("{{0:>{w}}}" * {n}).format(1) }}}}'),
    each('{{{{ ("{{x:>{w}}}" * {n}).format_map({{"x": 1}}) }}}}'),
    each('{{{{ ("%{w}d" * {n}) % ((1,) * {n}) }}}}'),
    each('{{{{ ("%{w}s" * {n}) | format(*(("x",) * {n})) }}}}'),
    each('{{% set s = "x" * {w} %}}{{{{ [s] * {n} }}}}'),
    each('{{% set s = "x" * {w} %}}{{{{ ([s] * {n}) | tojson }}}}'),
    each('{{% set s = "x" * {w} %}}{{{{ ([[s]] * {n}) | join }}}}'),
    st.builds(lambda n: f"{{{{ 'ab' * {n} }}}}", st.integers(10**6, 10**12)),
    st.builds(lambda n: "{{ " + "(" * n + "1" + ")" * n + " }}", st.integers(1_000, 5_000)),
    st.builds(lambda n: "{% if true %}" * n + "x" + "{% endif %}" * n, st.integers(50, 3_000)),
    st.builds(lambda n: "{% for a in range(100000) %}" * n + "{% endfor %}" * n,
              st.integers(2, 4)),
)
expressions = st.one_of(
    st.builds(lambda n: "(" * n + "true" + ")" * n, st.integers(21, 2_000)),
    st.builds(lambda n: "!" * n + "true", st.integers(201, 4_000)),
    st.builds(lambda n: "-" * n + "1 > 0", st.integers(201, 4_000)),
    st.builds(lambda n: "[" * n + "1" + "]" * n + " == []", st.integers(21, 2_000)),
    st.builds(lambda n: "size('ab' * " + str(n) + ") > 0", st.integers(10**5, 10**12)),
)


def nested(depth: int, leaf: object = 1) -> object:
    for level in range(depth):
        leaf = {"d": leaf} if level % 2 else [leaf]
    return leaf


def definition(name: str, **step_fields) -> dict:
    step = {"name": "a", "type": "tool", "tool": "core.echo", **step_fields}
    return {"name": name, "input_schema": {"type": "object"}, "steps": [step]}


# (field, value); a depth stands for data nested that deep, built in the test (Hypothesis
# would recurse printing the data itself).
hostile_definitions = st.one_of(
    st.tuples(st.just("params"), templates),
    st.tuples(st.just("when"), expressions),
    st.tuples(st.just("params-depth"), st.integers(60, 900)),
    st.tuples(st.just("params"), invalid_text),
    st.tuples(st.just("description"), invalid_text),
)


def json_text(body: object) -> str:
    # ensure_ascii: a lone surrogate travels as its JSON escape, as a hostile client sends it.
    return json.dumps(body, ensure_ascii=True)


def yaml_text(depth: int) -> str:
    return ("name: deep\ninput_schema: {type: object}\nsteps: [{name: a, type: tool, "
            "tool: core.echo, params: {x: " + "[" * depth + "1" + "]" * depth + "}}]\n")


# --- the callers -------------------------------------------------------------------------------

@pytest.fixture
def callers(team):
    return {"member": client_for(member(team, "h-member", role=Role.MEMBER)),
            "editor": client_for(member(team, "h-editor", role=Role.EDITOR))}


def stored() -> tuple[int, int, int]:
    return Workflow.objects.count(), WorkflowVersion.objects.count(), Run.objects.count()


def answer(client, url: str, text: str, content_type: str = "application/json"):
    """Post `text`; return (status, peak MB traced while answering)."""
    tracemalloc.start()
    try:
        response = client.generic("POST", url, text, content_type=content_type)
        peak = tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()
    return response, peak


def assert_refused_cheaply(response, peak: float, before: tuple[int, int, int]) -> None:
    assert response.status_code < 500, response.content[:300]
    assert 400 <= response.status_code < 500, response.content[:300]
    assert response.json()["errors"], response.content[:300]
    assert stored() == before
    assert peak < MEMORY_MB


# --- the properties ------------------------------------------------------------------------------

@pytest.mark.django_db
@EXAMPLES
@given(fields=hostile_definitions, who=st.sampled_from(["member", "editor"]))
def test_a_hostile_definition_is_refused_below_500_storing_nothing(callers, fields, who):
    field, value = fields
    name = f"h{next(_names)}"
    body = {"params": lambda: definition(name, params={"x": value}),
            "params-depth": lambda: definition(name, params={"x": nested(value)}),
            "when": lambda: definition(name, when=value),
            "description": lambda: {**definition(name), "description": value}}[field]()
    before = stored()

    for url in (VALIDATE, WORKFLOWS):
        response, peak = answer(callers[who], url, json_text(body))
        assert_refused_cheaply(response, peak, before)


@pytest.mark.django_db
@EXAMPLES
@given(depth=st.integers(65, 20_000), who=st.sampled_from(["member", "editor"]))
def test_deep_json_or_yaml_text_is_refused_below_500(callers, depth, who):
    before = stored()
    deep_json = '{"name": "deep", "input_schema": {"type": "object"}, "steps": ' + (
        "[" * depth + "]" * depth + "}")

    for text, content_type in ((deep_json, "application/json"),
                               (yaml_text(depth), "application/yaml")):
        for url in (VALIDATE, WORKFLOWS):
            response, peak = answer(callers[who], url, text, content_type)
            assert_refused_cheaply(response, peak, before)


@pytest.fixture
def support(team):
    version, _ = workflow_save(team=team, definition=example_definition("support"), actor=SETUP)
    return version


run_inputs = st.one_of(
    st.builds(lambda s: {"ticket_id": s, "body": "b", "customer_email": "e"}, invalid_text),
    st.builds(lambda s: {"ticket_id": "T", "body": "b", "customer_email": "e", s: 1},
              invalid_text),
    st.builds(lambda d: {"ticket_id": "T", "body": "b", "customer_email": "e", "depth": d},
              st.integers(65, 900)),
    st.builds(lambda n: {"ticket_id": "T", "body": "b" * n, "customer_email": "e"},
              st.integers(2**20, 2**21 - 100)),
)


@pytest.mark.django_db
@EXAMPLES
@given(run_input=run_inputs, who=st.sampled_from(["member", "editor"]))
def test_hostile_run_input_is_refused_below_500_and_starts_no_run(callers, support, run_input,
                                                                  who):
    if "depth" in run_input:
        run_input = {**run_input, "depth": nested(run_input["depth"])}
    before = stored()

    response, peak = answer(callers[who], RUNS, json_text({"input": run_input}))

    assert_refused_cheaply(response, peak, before)


def calling(name: str, callee: str | None) -> dict:
    if callee is None:
        return definition(name)
    return {"name": name, "input_schema": {"type": "object"},
            "steps": [{"name": "call", "type": "sub_workflow", "workflow": callee}]}


@pytest.mark.django_db
@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(length=st.integers(2, 7), who=st.sampled_from(["member", "editor"]))
def test_a_call_cycle_through_several_workflows_is_refused_with_its_chain(team, callers, length,
                                                                         who):
    chain = [f"r{next(_names)}" for _ in range(length)]
    # chain[0] exists without calls; chain[i] calls chain[i - 1]; then chain[0] calls the last.
    for index, name in enumerate(chain):
        workflow_save(team=team, definition=calling(name, chain[index - 1] if index else None),
                      actor=SETUP)
    before = stored()

    for url in (VALIDATE, WORKFLOWS):
        response, peak = answer(callers[who], url, json_text(calling(chain[0], chain[-1])))
        assert_refused_cheaply(response, peak, before)
        message = response.json()["errors"][0]["message"]
        if response.status_code == 400:
            assert " -> ".join([chain[0], *reversed(chain[1:]), chain[0]]) in message
