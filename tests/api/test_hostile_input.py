"""Hostile definitions and inputs through the API (issue 41), as a member and an editor would
send them: each is a 400 with its path, stores nothing and costs bounded memory; how long a
refusal takes is a figure for bench/hostile.py, not an assertion here."""
import tracemalloc

import pytest

from orchestrator.executors.tool import prepared_call
from orchestrator.models import Role, Workflow, WorkflowVersion
from orchestrator.retry import StepError
from orchestrator.services.workflows import workflow_publish, workflow_save
from tests.conftest import client_for
from tests.factories import SETUP, member

WORKFLOWS = "/api/v1/workflows/"
VALIDATE = "/api/v1/workflows/validate/"
MEMORY_MB = 64  # far below what the amplifications below would build unchecked


class PeakMemory:
    def __enter__(self):
        tracemalloc.start()
        return self

    def __exit__(self, *exc_info):
        self.mb = tracemalloc.get_traced_memory()[1] / 1e6
        tracemalloc.stop()


def definition(name="hostile", **step_fields) -> dict:
    step = {"name": "a", "type": "tool", "tool": "core.echo", **step_fields}
    return {"name": name, "input_schema": {"type": "object"}, "steps": [step]}


def calling(name: str, *callees: str) -> dict:
    steps = [{"name": f"call_{callee}", "type": "sub_workflow", "workflow": callee}
             for callee in callees] or [{"name": "a", "type": "tool", "tool": "core.echo"}]
    return {"name": name, "input_schema": {"type": "object"}, "steps": steps}


def assert_refused(response, path: str):
    assert response.status_code == 400, response.content[:500]
    errors = response.json()["errors"]
    assert path in {e["path"] for e in errors}, errors
    return errors


@pytest.fixture
def viewer(team):
    """A member of the support team without the right to save workflows."""
    return client_for(member(team, "viewer", role=Role.MEMBER))


# --- format amplification in templates ------------------------------------------------------------

AMPLIFIED = [
    '{{ ("{0:>1000000}" * 400).format(1) }}',
    '{{ ("{x:>1000000}" * 400).format_map({"x": 1}) }}',
    '{{ ("%1000000d" * 400) % ((1,) * 400) }}',
    '{{ ("%(a)s" * 400) % {"a": "x" * 1000000} }}',
    '{{ ("%1000000d" * 400) | format(*((1,) * 400)) }}',
    '{% set s = "x" * 1000000 %}{{ [s] * 200 }}',
    '{% set s = "x" * 1000000 %}{{ ([s] * 200) | tojson | length }}',
    '{% set s = "x" * 1000000 %}{{ "{}".format([s] * 200) | length }}',
    '{% set s = "x" * 1000000 %}{{ ([[s]] * 200) | join | length }}',
]


@pytest.mark.django_db
@pytest.mark.parametrize("text", AMPLIFIED)
def test_a_format_amplification_posted_by_a_member_to_validate_is_a_400_in_bounded_memory(
        viewer, text):
    with PeakMemory() as peak:
        response = viewer.post(VALIDATE, definition(params={"x": text}), format="json")

    errors = assert_refused(response, "steps[0].params.x")
    assert any("characters" in e["message"] or "long" in e["message"] for e in errors), errors
    assert peak.mb < MEMORY_MB


@pytest.mark.django_db
@pytest.mark.parametrize("text", AMPLIFIED[:5])
def test_a_format_amplification_saved_by_an_editor_is_a_400_and_stores_nothing(api, text):
    with PeakMemory() as peak:
        response = api.post(WORKFLOWS, definition(params={"x": text}), format="json")

    assert_refused(response, "steps[0].params.x")
    assert peak.mb < MEMORY_MB
    assert not Workflow.objects.exists()


def test_a_worker_rendering_an_amplification_fails_the_step_as_validation_in_bounded_memory():
    spec = {"tool": "core.echo", "params": {"x": "{{ (input.f * 400).format(1) }}"}}

    with PeakMemory() as peak, pytest.raises(StepError) as failure:
        prepared_call(spec, {"input": {"f": "{0:>1000000}"}, "steps": {}}, ctx=None)

    assert failure.value.error_class == "validation"
    assert "params could not be rendered" in str(failure.value)
    assert peak.mb < MEMORY_MB


# --- deep CEL nesting -------------------------------------------------------------------------------------

DEEP_CEL = ["(" * 1500 + "true" + ")" * 1500, "!" * 4000 + "true"]


@pytest.mark.django_db
@pytest.mark.parametrize("when", DEEP_CEL, ids=["parentheses", "negations"])
def test_deeply_nested_cel_is_a_400_with_its_path_on_validate_and_on_save(api, viewer, when):
    body = definition(when=when)

    for response in (viewer.post(VALIDATE, body, format="json"),
                     api.post(WORKFLOWS, body, format="json")):
        errors = assert_refused(response, "steps[0].when")
        assert any("nests too deeply" in e["message"] for e in errors), errors
    assert not Workflow.objects.exists()


# --- workflow call cycles ---------------------------------------------------------------------------------

@pytest.mark.django_db
def test_mutual_recursion_is_refused_at_save_with_the_chain(api, team):
    workflow_save(team=team, definition=calling("reca"), actor=SETUP)
    workflow_save(team=team, definition=calling("recb", "reca"), actor=SETUP)

    response = api.post(WORKFLOWS, calling("reca", "recb"), format="json")

    errors = assert_refused(response, "steps[0].workflow")
    assert "reca -> recb -> reca" in errors[0]["message"]
    assert Workflow.objects.get(name="reca").versions.count() == 1


@pytest.mark.django_db
def test_a_longer_chain_through_a_draft_is_refused_at_save_and_validate(api, viewer, team):
    for name, callee in (("other", ()), ("c1", ()), ("c2", ("c1",)), ("c3", ("c2",))):
        workflow_save(team=team, definition=calling(name, *callee), actor=SETUP)
    # c1's latest version calls c3, saved as a draft: it may be published later.
    c1 = Workflow.objects.get(name="c1")
    c1.publish_on_save = False
    c1.save(update_fields=["publish_on_save"])
    response = api.post(WORKFLOWS, calling("c1", "c3"), format="json")
    assert_refused(response, "steps[0].workflow")  # c1 -> c3 -> c2 -> c1

    errors = assert_refused(viewer.post(VALIDATE, calling("c1", "other", "c3"), format="json"),
                            "steps[1].workflow")
    assert "c1 -> c3 -> c2 -> c1" in errors[0]["message"]
    assert c1.versions.count() == 1


@pytest.mark.django_db
def test_publishing_an_old_version_that_closes_a_cycle_is_refused(api, team):
    workflow_save(team=team, definition=calling("pa"), actor=SETUP)
    workflow_save(team=team, definition=calling("pb", "pa"), actor=SETUP)
    pb = Workflow.objects.get(name="pb")
    # A version of pa that called pb was saved before pb called pa.
    pa = Workflow.objects.get(name="pa")
    WorkflowVersion.objects.create(workflow=pa, number=2, definition=calling("pa", "pb"),
                                   normalized=calling("pa", "pb") | {"steps": [
                                       {"name": "call_pb", "type": "sub_workflow",
                                        "workflow": "pb", "input": {}}]},
                                   digest="old")
    response = api.post(f"{WORKFLOWS}pa/versions/2/publish/")

    errors = assert_refused(response, "steps[0].workflow")
    assert "pa -> pb -> pa" in errors[0]["message"]
    pa.refresh_from_db()
    assert pa.active_version.number == 1
    with pytest.raises(Exception, match="cycle"):
        workflow_publish(workflow_id=pa.id, number=2, actor=SETUP)
    assert pb.versions.count() == 1


@pytest.mark.django_db
def test_a_diamond_of_calls_without_a_cycle_saves(api, team):
    workflow_save(team=team, definition=calling("leaf"), actor=SETUP)
    workflow_save(team=team, definition=calling("left", "leaf"), actor=SETUP)
    workflow_save(team=team, definition=calling("right", "leaf"), actor=SETUP)

    response = api.post(WORKFLOWS, calling("top", "left", "right"), format="json")

    assert response.status_code == 201, response.content
