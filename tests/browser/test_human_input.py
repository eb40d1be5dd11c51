"""A clerk who is not staff answers a human_input step in a real browser: signs in, finds the task
in the approvals inbox, reads the evidence, fills in the form drawn from the step's JSON Schema
and submits; real workers finish the run with the answer. A task answered meanwhile by someone
else is refused with a clear message (409), not an error page. The run's live page says what it
waits for and until when."""
import pytest

from approvals.models import InputTask
from orchestrator.engine.gallery import template_named
from orchestrator.engine.services.gallery import template_instantiate
from orchestrator.engine.services.runs import run_start
from orchestrator.models import Role, StepRun
from tests.conftest import client_for
from tests.factories import member

from .conftest import wait_for_run

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

IBAN = "DE89370400440532013000"


def sign_in(page, web_server, username: str, password: str) -> None:
    page.goto(f"{web_server}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_url(f"{web_server}/admin/")


def test_a_clerk_answers_in_the_admin_and_a_stale_task_is_refused(
        browser_page, screenshot, workers, web_server, team):
    editor = member(team, "editor", role=Role.EDITOR)
    clerk = member(team, "clerk", role=Role.MEMBER, groups=("clerks",))
    clerk.set_password("clerk-pass-1")
    clerk.save()
    other_clerk = member(team, "clerk_two", role=Role.MEMBER, groups=("clerks",))
    version, _ = template_instantiate(template="missing-field", team=team, actor=editor)
    sample = template_named("missing-field").sample_input
    run = run_start(version=version, input=sample, actor=editor)
    later = run_start(version=version, input={**sample, "document_id": "INV-2292"}, actor=editor)
    wait_for_run(run.id, states=("waiting",), timeout=60)
    wait_for_run(later.id, states=("waiting",), timeout=60)
    page = browser_page

    sign_in(page, web_server, "clerk", "clerk-pass-1")
    assert not clerk.is_staff
    assert page.inner_text(".waiting-count") == "2"
    assert "2 input tasks" in page.inner_text(".waiting-module")
    page.evaluate("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
    page.click(".waiting-module a")  # the approvals inbox, its input tasks first
    page.wait_for_selector("#input-inbox")
    assert page.locator("#input-inbox tbody tr").count() == 2
    screenshot(page, "input-inbox")

    task = InputTask.objects.get(run=run)
    page.click(f"#input-inbox a[href$='/inputtask/{task.id}/change/']")
    page.wait_for_selector("#answer-form")
    screenshot(page, "input-task")
    evidence = page.inner_text(".evidence")
    assert "Payable within 30 days by bank transfer." in evidence
    assert "vendor Acme Ltd, total 1,240.00 EUR" in evidence
    assert "names no IBAN" in page.inner_text(".instructions")
    # The form drawn from the schema: a text field and a choice, and abstaining is offered.
    assert page.locator("#answer_field_iban").get_attribute("maxlength") == "34"
    assert page.locator("#answer_field_source option").all_inner_texts() == [
        "—", "vendor master data", "earlier invoice", "phone call"]
    assert page.is_visible(".abstain-button")

    # Lower case: long enough for the form's field, refused by the schema's pattern (the
    # service's check), shown at the field; nothing changes.
    page.fill("#answer_field_iban", IBAN.lower())
    with page.expect_response(lambda r: r.request.method == "POST") as posted:
        page.click(".approve-button")
    assert posted.value.status == 400
    page.wait_for_selector(".errorlist")
    assert "does not match" in page.inner_text("#answer-form .errorlist")
    assert InputTask.objects.get(id=task.id).state == "open"

    page.fill("#answer_field_iban", IBAN)
    page.select_option("#answer_field_source", "vendor master data")
    page.fill("#answer_note", "From the vendor master data.")
    page.click(".approve-button")
    page.wait_for_selector(".messagelist")
    assert "Your answer is recorded: the run goes on." in page.inner_text(".messagelist")

    done = wait_for_run(run.id, states=("completed", "failed"), timeout=60)
    assert done.state == "completed", done.error
    stored = StepRun.objects.get(run=run, name="store").output
    assert stored["iban"] == IBAN and stored["given_by"] == "clerk"
    answered = InputTask.objects.get(id=task.id)
    assert answered.answered_by == clerk and answered.answer == {
        "iban": IBAN, "source": "vendor master data"}

    # The second task: opened, then answered by another clerk before this one submits.
    stale = InputTask.objects.get(run=later)
    page.goto(f"{web_server}/admin/approvals/inputtask/{stale.id}/change/")
    page.wait_for_selector("#answer-form")
    response = client_for(other_clerk).post(f"/api/v1/input-tasks/{stale.id}/answer/",
                                            {"answer": {"iban": IBAN}}, format="json")
    assert response.status_code == 200, response.json()
    page.fill("#answer_field_iban", "DE89370400440532099999")
    with page.expect_response(lambda r: r.request.method == "POST") as posted:
        page.click(".approve-button")
    assert posted.value.status == 409
    page.wait_for_selector(".errornote")
    assert "this task is answered already; nothing waits for an answer" in page.inner_text(".errornote")
    assert "by clerk_two" in page.inner_text(".answered")
    screenshot(page, "input-task-stale")
    assert InputTask.objects.get(id=stale.id).answer == {"iban": IBAN}


def test_the_run_page_says_what_the_run_waits_for_and_until_when(
        browser_page, screenshot, workers, web_server, team):
    editor = member(team, "editor", role=Role.EDITOR)
    operator = member(team, "ops_olga", role=Role.OPERATOR, staff=True)
    operator.set_password("operate-pass-1")
    operator.save()
    version, _ = template_instantiate(template="missing-field", team=team, actor=editor)
    run = run_start(version=version, input=template_named("missing-field").sample_input,
                    actor=editor)
    wait_for_run(run.id, states=("waiting",), timeout=60)
    task = InputTask.objects.get(run=run)
    page = browser_page
    sign_in(page, web_server, "ops_olga", "operate-pass-1")
    page.goto(f"{web_server}/admin/orchestrator/run/{run.id}/live/")
    page.wait_for_function("document.querySelector('#step-ask_iban')?.dataset.state === 'waiting'")
    shown = page.inner_text("#run-approvals")
    assert "Waiting for input" in shown
    until = task.deadline_at.strftime("%Y-%m-%d %H:%M:%S")
    assert f"ask_iban waits for input from clerks until {until} UTC" in shown
    assert page.get_attribute(".live-input a", "href") == (
        f"/admin/approvals/inputtask/{task.id}/change/")
    screenshot(page, "live-run-waiting-for-input")
