"""Live pages in a real browser: a run page left open follows the run as real workers move it,
without a reload; the operations page shows the run's team. The server is uvicorn (as in
`make run`): its outbox relay reads what the workers commit and nudges the page's websocket."""
import pytest
from django.contrib.auth.models import Group

from approvals.models import ApprovalRequest
from orchestrator.engine.services import reaper
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role, StepRun
from tests.conftest import client_for
from tests.factories import SETUP, example_definition, member

from .conftest import wait_for, wait_for_run

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

TWO_GATES = {
    "name": "live-demo",
    "description": "Two approvals with a tool step after each, to watch a run move.",
    "input_schema": {"type": "object"},
    "steps": [
        {"name": "hold", "type": "human_gate", "approvers": "support_leads", "timeout_s": 3600,
         "instructions": "Let the run start its work."},
        {"name": "fetch", "type": "tool", "tool": "core.echo", "after": ["hold"], "params": {"fetched": True}},
        {"name": "check", "type": "human_gate", "after": ["fetch"], "approvers": "support_leads",
         "timeout_s": 3600, "instructions": "Let the run finish."},
        {"name": "finish", "type": "tool", "tool": "core.echo", "after": ["check"], "params": {"done": True}},
    ],
}
TICKET = {"ticket_id": "T-1001", "customer_email": "sam@example.com",
          "body": "Hello, I was charged twice for my March invoice (INV-2291). "
                  "Could you refund the duplicate charge? Thanks, Sam"}

# Installed before the page's own scripts: records every state each step row shows, in order,
# and a marker that a reload would wipe out.
RECORDER = """
window.__notReloaded = true;
window.__seen = {};
new MutationObserver(() => {
  for (const row of document.querySelectorAll('#run-steps tbody tr[id^="step-"]')) {
    const name = row.id.slice(5), seen = (window.__seen[name] = window.__seen[name] || []);
    if (seen[seen.length - 1] !== row.dataset.state) seen.push(row.dataset.state);
  }
}).observe(document, {subtree: true, childList: true});
"""


def sign_in(page, web_server, username: str, password: str) -> None:
    page.goto(f"{web_server}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_url(f"{web_server}/admin/")


def operator_with_password(team):
    user = member(team, "ops_olga", role=Role.OPERATOR, staff=True)
    user.set_password("operate-pass-1")
    user.save()
    return user


def approve(api, run_id, step: str) -> None:
    request = ApprovalRequest.objects.get(run_id=run_id, step__name=step, state="pending")
    response = api.post(f"/api/v1/approvals/{request.id}/approve/",
                        {"proposal_hash": request.proposal_hash}, format="json")
    assert response.status_code == 200, response.json()


def step_state(page, name: str) -> str:
    return page.get_attribute(f"#step-{name}", "data-state")


def test_a_run_page_follows_every_step_of_a_run_without_a_reload(browser_page, workers, web_server, team):
    operator_with_password(team)
    starter = member(team, "starter", role=Role.EDITOR)
    approver = member(team, "lead", role=Role.MEMBER, groups=("support_leads",))
    workflow_save(team=team, definition=TWO_GATES, actor=SETUP)
    page = browser_page
    page.add_init_script(RECORDER)
    sign_in(page, web_server, "ops_olga", "operate-pass-1")

    response = client_for(starter).post("/api/v1/workflows/live-demo/runs/", {"input": {}}, format="json")
    assert response.status_code == 202, response.json()
    run_id = response.json()["id"]
    wait_for_run(run_id, states=("waiting",))
    page.goto(f"{web_server}/admin/orchestrator/run/{run_id}/live/")
    page.wait_for_selector("#live-status.live-live")
    page.wait_for_function("document.querySelector('#step-hold')?.dataset.state === 'waiting'")
    assert [step_state(page, s) for s in ("fetch", "check", "finish")] == ["blocked"] * 3
    assert "Decide on hold" in page.inner_text("#run-approvals")
    assert page.inner_text("#run-progress").startswith("0 of 4 steps ended")

    api = client_for(approver)
    approve(api, run_id, "hold")
    page.wait_for_function("document.querySelector('#step-check')?.dataset.state === 'waiting'")
    assert [step_state(page, s) for s in ("hold", "fetch")] == ["completed", "completed"]
    assert page.inner_text("#run-progress").startswith("2 of 4 steps ended")

    approve(api, run_id, "check")
    page.wait_for_function("document.querySelector('#run-state')?.dataset.state === 'completed'")
    assert [step_state(page, s) for s in ("hold", "fetch", "check", "finish")] == ["completed"] * 4
    assert page.inner_text("#run-progress").startswith("4 of 4 steps ended")
    assert page.is_hidden("#run-approvals")

    seen = page.evaluate("window.__seen")
    assert page.evaluate("window.__notReloaded") is True
    for step in ("hold", "fetch", "check", "finish"):  # each changed on the open page
        assert seen[step][-1] == "completed" and len(seen[step]) >= 2, seen


def test_the_support_run_page_and_the_operations_page(browser_page, screenshot, workers, web_server, team):
    """The support example waiting for its approval (the docs' screenshots are taken here)."""
    operator = operator_with_password(team)
    starter = member(team, "agent_smith", role=Role.EDITOR)
    Group.objects.get_or_create(name="support_leads")
    workflow_save(team=team, definition=example_definition("support"), actor=SETUP)
    response = client_for(starter).post("/api/v1/workflows/support-reply/runs/", {"input": TICKET},
                                        format="json")
    run_id = response.json()["id"]
    wait_for_run(run_id, states=("waiting",), timeout=60)
    page = browser_page
    sign_in(page, web_server, operator.username, "operate-pass-1")
    page.evaluate("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
    page.goto(f"{web_server}/admin/orchestrator/run/{run_id}/live/")
    page.wait_for_function("document.querySelector('#step-approve')?.dataset.state === 'waiting'")
    assert "Decide on approve" in page.inner_text("#run-approvals")
    assert "of $2.0000 budget" in page.inner_text("#run-cost")
    assert page.is_visible("#control-cancel")
    page.wait_for_timeout(300)  # let the graph's layout settle for the picture
    screenshot(page, "live-run-page")

    page.goto(f"{web_server}/admin/orchestrator/run/operations/")
    page.wait_for_selector("#ops-states [data-state=waiting]")
    assert page.inner_text("#ops-states [data-state=waiting] strong") == "1"
    gate = page.locator("#ops-waiting tr", has=page.locator("[data-kind=human_gate]"))
    assert gate.locator("td").all_inner_texts()[:2] == ["human gate", "1"]
    assert "orchestrator" in page.inner_text("#ops-queues")
    assert team.slug in page.inner_text("#ops-teams")
    screenshot(page, "operations-page")

    page.goto(f"{web_server}/admin/orchestrator/run/")  # the run list: counts, rows kept fresh
    page.wait_for_selector("#run-counts [data-state=waiting]")
    assert page.inner_text("#run-counts [data-state=waiting] strong") == "1"
    page.check("#result_list input.action-select")
    cancel = client_for(starter).post(f"/api/v1/runs/{run_id}/cancel/")
    assert cancel.status_code == 202, cancel.json()
    page.wait_for_selector("#run-counts [data-state=cancelled]")
    page.wait_for_function("document.querySelector('#result_list tbody tr').innerText.includes('cancelled')")
    assert page.is_checked("#result_list input.action-select")  # the selection survived
    assert page.is_hidden("#run-list-changed")


def test_a_run_page_says_until_when_a_run_sleeps_and_follows_it_waking(
        browser_page, screenshot, workers, web_server, team):
    operator_with_password(team)
    workflow_save(team=team, definition={
        "name": "napper", "input_schema": {"type": "object"},
        "steps": [{"name": "nap", "type": "sleep", "for_s": 3},
                  {"name": "after", "type": "tool", "tool": "core.echo", "after": ["nap"]}]},
        actor=SETUP)
    response = client_for(member(team, "starter", role=Role.EDITOR)).post(
        "/api/v1/workflows/napper/runs/", {"input": {}}, format="json")
    run_id = response.json()["id"]
    wait_for_run(run_id, states=("waiting",))
    wake_at = StepRun.objects.get(run_id=run_id, name="nap").wake_at
    page = browser_page
    sign_in(page, web_server, "ops_olga", "operate-pass-1")
    page.goto(f"{web_server}/admin/orchestrator/run/{run_id}/live/")
    page.wait_for_function("document.querySelector('#step-nap')?.dataset.state === 'waiting'")

    shown = page.inner_text("#run-approvals")
    assert "Sleeping" in shown
    assert f"nap sleeps until {wake_at.strftime('%Y-%m-%d %H:%M:%S')} UTC" in shown
    screenshot(page, "live-run-sleeping")

    def swept():  # as beat's sweeps would
        reaper.reap()
        return page.evaluate("document.querySelector('#run-state')?.dataset.state === 'completed'")

    wait_for(swept, timeout=30, interval=0.3)
    assert step_state(page, "nap") == "completed"
    assert page.is_hidden("#run-approvals")


def test_a_run_page_says_which_signal_a_run_waits_for_until_when_and_follows_it_arriving(
        browser_page, screenshot, workers, web_server, team):
    operator_with_password(team)
    workflow_save(team=team, definition={
        "name": "order", "input_schema": {"type": "object"},
        "steps": [{"name": "pay", "type": "wait", "signal": "paid", "timeout_s": 600},
                  {"name": "after", "type": "tool", "tool": "core.echo", "after": ["pay"]}]},
        actor=SETUP)
    starter = client_for(member(team, "starter", role=Role.EDITOR))
    run_id = starter.post("/api/v1/workflows/order/runs/", {"input": {}}, format="json").json()["id"]
    wait_for_run(run_id, states=("waiting",))
    until = StepRun.objects.get(run_id=run_id, name="pay").deadline_at
    page = browser_page
    sign_in(page, web_server, "ops_olga", "operate-pass-1")
    page.goto(f"{web_server}/admin/orchestrator/run/{run_id}/live/")
    page.wait_for_function("document.querySelector('#step-pay')?.dataset.state === 'waiting'")

    shown = page.inner_text("#run-approvals")
    assert "Waiting for a signal" in shown
    assert f"pay waits for signal paid until {until.strftime('%Y-%m-%d %H:%M:%S')} UTC" in shown
    screenshot(page, "live-run-waiting-for-signal")

    sent = starter.post(f"/api/v1/runs/{run_id}/signals/paid/", {"payload": {"ok": True}},
                        format="json")
    assert sent.status_code == 202
    page.wait_for_function("document.querySelector('#run-state')?.dataset.state === 'completed'",
                           timeout=30000)
    assert step_state(page, "pay") == "completed"
    assert page.is_hidden("#run-approvals")


def test_a_held_runs_page_says_its_place_in_line_and_follows_it_starting(
        browser_page, screenshot, workers, web_server, team):
    operator_with_password(team)
    workflow_save(team=team, definition={
        "name": "refund-one", "input_schema": {"type": "object", "required": ["customer"],
                                               "properties": {"customer": {"type": "string"}}},
        "concurrency": {"key": "{{ input.customer }}", "limit": 1},
        "steps": [{"name": "hold", "type": "human_gate", "approvers": "support_leads", "timeout_s": 3600},
                  {"name": "refund", "type": "tool", "tool": "core.echo", "after": ["hold"]}]},
        actor=SETUP)
    starter = client_for(member(team, "starter", role=Role.EDITOR))
    first, second, third = (starter.post("/api/v1/workflows/refund-one/runs/", {"input": {"customer": "alice"}},
                                         format="json").json()["id"] for _ in range(3))
    wait_for_run(first, states=("waiting",))
    page = browser_page
    sign_in(page, web_server, "ops_olga", "operate-pass-1")
    page.goto(f"{web_server}/admin/orchestrator/run/{third}/live/")
    page.wait_for_function("document.querySelector('#run-state')?.dataset.state === 'pending'")

    shown = page.inner_text("#run-approvals")
    assert "Waiting its turn" in shown
    assert 'Runs of concurrency key "alice" are at their limit: this run is number 2 in line' in shown
    screenshot(page, "live-run-held")
    page.goto(f"{web_server}/admin/orchestrator/run/{second}/live/")
    page.wait_for_function("document.querySelector('#run-approvals')?.innerText.includes('next in line')")

    approve(client_for(member(team, "lead", role=Role.MEMBER, groups=("support_leads",))), first, "hold")
    wait_for_run(first, states=("completed",))
    # The page left open follows the run out of the line, without a reload.
    page.wait_for_function("document.querySelector('#run-state')?.dataset.state === 'waiting'", timeout=20_000)
    assert page.is_hidden("#run-approvals") or "Waiting its turn" not in page.inner_text("#run-approvals")
