"""Hostile definitions and inputs through the API (issue 41), as a member and an editor would
send them: each is a 400 with its path, stores nothing and costs bounded memory; how long a
refusal takes is a figure for bench/hostile.py, not an assertion here."""
import tracemalloc

import pytest

from orchestrator.engine.executors.tool import prepared_call
from orchestrator.engine.retry import StepError
from orchestrator.engine.services.workflows import workflow_publish, workflow_save
from orchestrator.models import Role, Workflow, WorkflowVersion
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


# --- text that is not valid Unicode -----------------------------------------------------------------------

RUNS = "/api/v1/workflows/support-reply/runs/"


def post_json(client, url, text: str):
    return client.generic("POST", url, text, content_type="application/json")


@pytest.mark.django_db
def test_a_lone_surrogate_in_a_description_is_a_400_on_validate_and_save_and_stores_nothing(
        api, viewer):
    body = ('{"name": "uni", "description": "\\ud800", "input_schema": {"type": "object"}, '
            '"steps": [{"name": "a", "type": "tool", "tool": "core.echo"}]}')

    for response in (post_json(viewer, VALIDATE, body), post_json(api, WORKFLOWS, body)):
        errors = assert_refused(response, "description")
        assert "not valid Unicode" in errors[0]["message"]
    yaml_text = body.replace('"description": "\\ud800"', '"description": "ok", "x-\\udc00": 1')
    response = api.generic("POST", WORKFLOWS, yaml_text, content_type="application/yaml")
    assert_refused(response, "")
    assert not Workflow.objects.exists()


@pytest.fixture
def support(team):
    from tests.factories import example_definition

    version, _ = workflow_save(team=team, definition=example_definition("support"), actor=SETUP)
    return version


@pytest.mark.django_db
def test_run_input_with_a_lone_surrogate_is_a_400_and_creates_no_run(api, support):
    from orchestrator.models import Run

    body = '{"input": {"ticket_id": "\\udfff", "body": "b", "customer_email": "e"}}'

    errors = assert_refused(post_json(api, RUNS, body), "input.ticket_id")

    assert "U+DFFF" in errors[0]["message"]
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_run_input_reaching_run_start_by_another_path_is_refused_with_its_path(support):
    from orchestrator.engine.errors import InputInvalid
    from orchestrator.engine.services.runs import run_start
    from orchestrator.models import Run

    with pytest.raises(InputInvalid) as refused:
        run_start(version=support, input={"ticket_id": "\udfff", "body": "b",
                                          "customer_email": "e"}, actor=SETUP)

    assert "input.ticket_id" in str(refused.value.problems)
    assert not Run.objects.exists()


def test_a_tool_result_that_is_not_valid_unicode_fails_the_step_before_it_is_stored():
    from orchestrator.engine.output_schemas import validate_output

    with pytest.raises(StepError) as failure:
        validate_output(None, {"rows": [{"name": "ok"}, {"name": "bad\ud800"}]})

    assert failure.value.error_class == "invalid_output"
    assert "rows/1/name" in failure.value.message


@pytest.mark.django_db
def test_a_run_stored_with_invalid_text_still_shows_in_the_api_and_the_admin(api, team, requester,
                                                                             client):
    from django.db import connection

    if connection.vendor == "postgresql":
        pytest.skip("PostgreSQL's json refuses a lone surrogate: such text cannot be stored there")
    from django.contrib.auth.models import User

    from orchestrator.models import Run
    from tests.api.driving import support_run

    run = support_run(team, requester)
    # Stored before the check existed (SQLite keeps a JSON escape such as \udfff as text).
    Run.objects.filter(pk=run.pk).update(
        input={"ticket_id": "\udfff", "body": "b", "customer_email": "e"},
        error={"class": "permanent", "message": "bad \ud800 text"})
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))

    detail = api.get(f"/api/v1/runs/{run.id}/")
    listing = api.get("/api/v1/runs/")
    page = client.get(f"/admin/orchestrator/run/{run.id}/change/")

    assert detail.status_code == 200, detail.content[:300]
    assert detail.json()["input"]["ticket_id"] == "\ufffd"
    assert listing.status_code == 200
    assert page.status_code == 200
    assert "\ufffd" in page.content.decode()


@pytest.mark.django_db
def test_an_admin_forms_json_with_a_lone_surrogate_is_a_trigger_problem_with_its_path(team):
    from triggers.models import Trigger
    from triggers.services.config import trigger_problems

    trigger = Trigger(team=team, kind="api", name="t", input_template={"ticket": ["ok", "\ud800"]})

    problems = trigger_problems(trigger)

    assert {"path": "input_template.ticket[1]", "message": problems[0]["message"]} in problems
    assert "not valid Unicode" in problems[0]["message"]


@pytest.mark.django_db
def test_a_signed_webhook_with_a_lone_surrogate_is_refused_and_starts_no_run(client, team,
                                                                           support):
    from orchestrator.models import Run
    from tests.triggers.conftest import deliver, make_trigger

    trigger, secret = make_trigger(team, "webhook")

    response = deliver(client, trigger, secret, body=b'{"ticket": {"id": "\\udfff"}}')

    assert response.status_code == 400, response.content
    assert "not valid Unicode" in response.json()["errors"][0]["message"]
    assert not Run.objects.exists()
