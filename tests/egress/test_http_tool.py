"""`http.request` under the egress policy: run-time refusals, the step's deadline, the size cap,
redirects and per-team policies, for real runs against real local servers."""

import pytest
from django.test import override_settings

from audit.services import external_call_authorize
from budgets.services import cost_of
from orchestrator.engine.executors import ExecContext, execute
from orchestrator.engine.retry import StepError
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from tests.factories import SETUP, TeamFactory
from tests.support.egress import LOCAL_SERVERS
from tests.support.hostile_server import HostileServer

ANY_PORT = {"default": {"ports": "*"}}
LOOPBACK = {"default": {"ports": "*", "allow_networks": ["127.0.0.0/8"]}}


@pytest.fixture
def server():
    with HostileServer() as running:
        yield running


@pytest.fixture
def run_tool(team):
    """Execute a one-step workflow's tool step the way a worker's executor does. The step is
    saved under the suite's policy (loopback allowed), so the URL meets the policy under test
    at run time only, as a templated or since-forbidden URL would."""

    def run(step: dict, *, run_input: dict | None = None, for_team=None):
        for_team = for_team or team
        definition = {"name": "egress-tool", "input_schema": {"type": "object"},
                      "steps": [{"name": "call", "type": "tool", "tool": "http.request", **step}]}
        with override_settings(STEPWISE_EGRESS=LOCAL_SERVERS):
            version, _ = workflow_save(team=for_team, definition=definition, actor=SETUP)
        started = run_start(version=version, input=run_input or {}, actor=SETUP)
        row = started.steps.get(name="call")
        ctx = ExecContext(str(started.id), version.workflow.name, "call", 1,
                          f"{started.id}:call:default", step_id=row.id,
                          authorize=external_call_authorize, price=cost_of)
        spec = version.normalized["steps"][0]
        return execute(spec, {"input": run_input or {}, "steps": {}}, ctx)

    return run


def test_loopback_is_refused_at_run_time_as_a_policy_error(run_tool, server, settings):
    step = {"params": {"url": "{{ input.url }}"}}
    settings.STEPWISE_EGRESS = ANY_PORT
    with pytest.raises(StepError) as refused:
        run_tool(step, run_input={"url": f"http://2130706433:{server.port}/ok"})
    assert refused.value.error_class == "policy"
    assert "127.0.0.1 is a loopback address" in refused.value.message
    assert server.requests == []


@pytest.mark.django_db(transaction=True)
def test_the_products_own_api_is_refused(run_tool, live_server, settings):
    settings.STEPWISE_EGRESS = ANY_PORT
    with pytest.raises(StepError) as refused:
        run_tool({"params": {"url": "{{ input.url }}"}},
                 run_input={"url": f"{live_server.url}/api/v1/health/"})
    assert refused.value.error_class == "policy"


def test_a_trickling_server_is_cut_off_at_the_steps_timeout(run_tool, server, settings):
    settings.STEPWISE_EGRESS = LOOPBACK
    with pytest.raises(StepError) as late:
        # The params allow 30 s and the trickle lasts 6 s; the step's own timeout is 1 s and wins.
        run_tool({"timeout_s": 1, "params": {"url": f"{server.url}/trickle?bytes=60&every=0.1"}})
    assert late.value.error_class == "timeout"
    assert "deadline of 1 s" in late.value.message


def test_the_params_timeout_is_a_deadline_for_the_whole_call(run_tool, server, settings):
    settings.STEPWISE_EGRESS = LOOPBACK
    with pytest.raises(StepError) as late:
        run_tool({"params": {"url": f"{server.url}/trickle?bytes=60&every=0.1", "timeout_s": 0.5}})
    assert late.value.error_class == "timeout"
    assert "deadline of 0.5 s" in late.value.message


def test_an_oversized_response_fails_the_step_permanently(run_tool, server, settings):
    settings.STEPWISE_EGRESS = LOOPBACK
    with pytest.raises(StepError) as big:
        run_tool({"params": {"url": f"{server.url}/big?mb=40"}})
    assert big.value.error_class == "permanent"
    assert "max_response_bytes" in big.value.message


def test_a_teams_cap_and_networks_apply_to_its_runs(run_tool, server, settings, team):
    settings.STEPWISE_EGRESS = {**ANY_PORT, "teams": {team.slug: {
        "allow_networks": ["127.0.0.0/8"], "max_response_bytes": 3 * 1024 * 1024}}}
    output = run_tool({"params": {"url": f"{server.url}/big?mb=2"}}).output
    assert output["status"] == 200 and len(output["body"]) == 2 * 1024 * 1024
    other = TeamFactory(slug="research")
    with pytest.raises(StepError) as refused:
        run_tool({"params": {"url": f"{server.url}/big?mb=2"}}, for_team=other)
    assert refused.value.error_class == "policy"


def test_redirects_are_returned_unless_followed_and_each_hop_is_checked(run_tool, server, settings):
    settings.STEPWISE_EGRESS = LOOPBACK
    to_metadata = f"{server.url}/redirect?to=http://169.254.169.254/latest/meta-data/"
    output = run_tool({"params": {"url": to_metadata}}).output
    assert output["status"] == 302
    with pytest.raises(StepError) as refused:
        run_tool({"params": {"url": to_metadata, "follow_redirects": True}})
    assert refused.value.error_class == "policy" and "metadata" in refused.value.message
    followed = run_tool({"params": {"url": f"{server.url}/redirect?to={server.url}/ok",
                                    "follow_redirects": True}}).output
    assert followed["status"] == 200 and followed["body"] == {"ok": True}


def test_a_malformed_policy_setting_fails_calls_closed(run_tool, server, settings):
    settings.STEPWISE_EGRESS = {"default": {"allow_networks": ["127.0.0.0/33"]}}
    with pytest.raises(StepError) as refused:
        run_tool({"params": {"url": f"{server.url}/ok"}})
    assert refused.value.error_class == "policy" and server.requests == []
