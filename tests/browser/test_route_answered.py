"""The run page says which model route answered a step, and which failed before it: a routed
model whose first route (a local OpenAI-compatible server) answers 503 and whose second (a local
Anthropic-compatible one) answers, called by real workers (tests/integration/test_llm_routes.py)."""
import pytest

from tests.integration.test_llm_routes import route_workers, servers, start  # noqa: F401 (fixtures)
from tests.support.fake_llm import status

from .conftest import wait_for_run
from .test_live import operator_with_password, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_the_run_page_shows_the_route_that_answered_and_the_one_that_failed_before_it(
        browser_page, servers, web_server, team, screenshot):  # noqa: F811
    primary, _ = servers
    primary.default = status(503, message="upstream overloaded")
    operator_with_password(team)
    run = wait_for_run(start(team, "gw_503").id, states=("completed", "failed"))
    assert run.state == "completed", run.error
    page = browser_page
    sign_in(page, web_server, "ops_olga", "operate-pass-1")

    page.goto(f"{web_server}/admin/orchestrator/run/{run.id}/live/")
    note = page.wait_for_selector("#route-classify")

    first, = note.query_selector_all(".live-route-failed li")
    assert note.inner_text().startswith(
        "answered by anthropic:claude-gw_503@127.0.0.1 (anthropic)")
    assert first.inner_text() == ("openai:gpt-gw_503@127.0.0.1 (openai) failed transient: "
                                  "HTTP 503: upstream overloaded")
    screenshot(page, "route-answered")
