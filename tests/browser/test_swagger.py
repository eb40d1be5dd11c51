"""The API's Swagger UI (and ReDoc) render with no network but the local server: its assets come from
drf-spectacular-sidecar (collected static files), never a CDN. Every request the page makes to
anything but the server is aborted and recorded; the page must render the API's operations all
the same, and "Authorize" must offer the token scheme first, asking for the bare key."""
import os
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def outside(browser_page, web_server):
    """What the page asked of any host but the server: each request aborted and listed."""
    asked = []

    def only_local(route):
        if route.request.url.startswith(web_server):
            route.continue_()
        else:
            asked.append(route.request.url)
            route.abort()

    browser_page.route("**/*", only_local)
    return asked


def test_swagger_ui_renders_offline_with_the_token_scheme_first(browser_page, web_server, outside):
    browser_page.goto(f"{web_server}/api/v1/docs/")
    browser_page.wait_for_selector(".swagger-ui .info .title")
    assert "Stepwise API" in browser_page.inner_text(".swagger-ui .info .title")
    browser_page.wait_for_selector(".opblock-tag-section")
    assert browser_page.locator(".opblock").count() > 10  # the operations are listed

    browser_page.click("button.authorize")
    browser_page.wait_for_selector(".auth-container")
    names = browser_page.locator(".auth-container h4").all_inner_texts()
    assert names and names[0].startswith("tokenAuth"), names
    assert "(http, Bearer)" in browser_page.inner_text(".auth-container >> nth=0")
    if os.environ.get("STEPWISE_SCREENSHOT_DIR"):  # the docs' picture: the dialog, as seen
        browser_page.screenshot(path=str(Path(os.environ["STEPWISE_SCREENSHOT_DIR"])
                                         / "swagger-offline.png"))
    assert outside == []  # nothing was even asked of another host


def test_redoc_renders_offline(browser_page, web_server, outside):
    browser_page.goto(f"{web_server}/api/v1/redoc/")
    # ReDoc parses and lays out the whole schema before it draws anything; on a machine busy
    # with other tests that takes longer than a page's usual wait.
    browser_page.wait_for_selector("h1", timeout=90_000)
    assert "Stepwise API" in browser_page.inner_text("h1")
    browser_page.wait_for_selector("text=API docs by Redocly")  # the footer, whose logo ...
    assert outside == []  # ... is served here like everything else (orchestrator/web/api/docs.py)
