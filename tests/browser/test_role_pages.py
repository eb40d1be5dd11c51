"""Each role's main page, at a desktop's width and a phone's (390 px): it renders, makes no
request to another host, and logs no console error. The screenshots in docs/ (roles-*.png: the first screen, as the person
sees it on arrival) are taken here (STEPWISE_SCREENSHOT_DIR=docs)."""
import os
from pathlib import Path

import pytest

from orchestrator.models import Role
from tests.approvals.conftest import support_gate
from tests.factories import member

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# (role, how the person is made, their main page, what shows it rendered)
ROLES = [
    ("reviewer", dict(role=Role.MEMBER, groups=("support_leads",)), "/admin/", ".waiting-module"),
    ("reviewer-inbox", dict(role=Role.MEMBER, groups=("support_leads",)),
     "/admin/approvals/approvalrequest/", "#result_list"),
    ("operator", dict(role=Role.OPERATOR, staff=True), "/admin/orchestrator/run/operations/", "#content"),
    ("author", dict(role=Role.EDITOR, staff=True),
     "/admin/orchestrator/workflow/builder/?template=support-reply", "#builder-canvas, #content"),
    ("owner", dict(role=Role.OWNER, staff=True), "/admin/budgets/costreport/", "#cost-per-day"),
    ("auditor", dict(role=Role.MEMBER, staff=True, groups=("auditors",)), "/admin/audit/auditentry/",
     "#result_list"),
    ("api-developer", dict(role=Role.EDITOR), "/api/v1/docs/", ".swagger-ui .info .title"),
]
SIZES = {"desktop": {"width": 1440, "height": 900}, "390": {"width": 390, "height": 844}}


@pytest.mark.parametrize("role, made, url, ready", ROLES, ids=[r[0] for r in ROLES])
def test_each_roles_main_page_at_desktop_and_phone_width(browser, web_server, team, requester,
                                                         role, made, url, ready):
    support_gate(team, requester)  # something waits, something was spent and audited
    person = member(team, role, **made)
    person.set_password("role-pass-1")
    person.save()
    for size, viewport in SIZES.items():
        outside, errors = visit(browser, web_server, role, url, ready, f"roles-{role}-{size}", viewport)
        assert outside == [], (size, outside)
        assert errors == [], (size, errors)


def visit(browser, web_server: str, username: str, url: str, ready: str, name: str,
          viewport: dict) -> tuple[list[str], list[str]]:
    """Sign in, open `url`, wait for `ready`; (requests to other hosts, console errors and
    4xx/5xx answers)."""
    context = browser.new_context(viewport=viewport, locale="en-US", color_scheme="light")
    page = context.new_page()
    page.set_default_timeout(30_000)
    outside, errors = [], []
    local = (web_server, web_server.replace("http", "ws"), "data:", "blob:")
    page.on("console", lambda msg: errors.append(f"{msg.text} {msg.location}") if msg.type == "error" else None)
    page.on("response", lambda res: errors.append(f"{res.status} {res.url}") if res.status >= 400 else None)
    page.on("request", lambda req: None if req.url.startswith(local) else outside.append(req.url))
    try:
        if url.startswith("/admin/"):  # the API's docs need no sign-in
            page.goto(f"{web_server}/admin/login/?next=/admin/")
            page.fill("#id_username", username)
            page.fill("#id_password", "role-pass-1")
            page.click("input[type=submit]")
            page.wait_for_url(f"{web_server}/admin/")
            page.evaluate("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
        response = page.goto(f"{web_server}{url}")
        assert response.status == 200, (username, url, response.status)
        page.wait_for_selector(ready)
        page.wait_for_timeout(1000)  # charts and graphs drawn
        if folder := os.environ.get("STEPWISE_SCREENSHOT_DIR"):  # what a person sees on arrival
            page.screenshot(path=str(Path(folder) / f"{name}.png"))
    finally:
        context.close()
    return outside, errors
