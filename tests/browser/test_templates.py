"""An editor starts a workflow from the template gallery in a real browser: the workflow list
links to "New workflow from template", the gallery shows every template, one click saves the
draft-critique-revise loop; a run of it, on real workers, lists each iteration's steps among its
step runs."""
import json

import pytest

from orchestrator.engine.gallery import template_named, templates
from orchestrator.engine.services.runs import run_start
from orchestrator.models import Role, Run, Workflow
from tests.factories import member

from .conftest import wait_for_run

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_an_editor_creates_a_workflow_from_a_template_and_its_loop_runs(
        browser_page, screenshot, workers, web_server, team):
    editor = member(team, "editor", role=Role.EDITOR, staff=True)
    editor.set_password("edit-pass-1")
    editor.save()
    page = browser_page
    page.goto(f"{web_server}/admin/login/?next=/admin/orchestrator/workflow/")
    page.fill("#id_username", "editor")
    page.fill("#id_password", "edit-pass-1")
    page.click("input[type=submit]")
    page.evaluate("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")

    page.click("text=New workflow from template")
    page.wait_for_selector(".gallery")
    assert page.locator(".gallery .card").count() == len(templates())
    screenshot(page, "templates-gallery")

    page.click("#template-revise-until-approved input[type=submit]")
    page.wait_for_selector(".messagelist")
    assert "Workflow revise-until-approved v1 created." in page.inner_text(".messagelist")
    workflow = Workflow.objects.get(name="revise-until-approved", team=team)

    version = workflow.versions.get()
    run = run_start(version=version, input=template_named(workflow.name).sample_input, actor=editor)
    assert wait_for_run(run.id, states=("completed", "failed"), timeout=60).state == "completed"
    # The run's step runs, in the order they started: one row per iteration's step.
    page.goto(f"{web_server}/admin/orchestrator/steprun/?q={run.id}&o=7")
    text = page.inner_text("#result_list")
    for name in ("draft[1]", "critique[1]", "draft[2]", "critique[2]", "publish"):
        assert name in text
    screenshot(page, "templates-loop-run")


def test_a_workflow_made_from_a_template_is_run_from_its_page_with_the_sample_input(
        browser_page, screenshot, web_server, team):
    editor = member(team, "editor", role=Role.EDITOR, staff=True)
    editor.set_password("edit-pass-1")
    editor.save()
    page = browser_page
    page.goto(f"{web_server}/admin/login/?next=/admin/orchestrator/workflow/from-template/")
    page.fill("#id_username", "editor")
    page.fill("#id_password", "edit-pass-1")
    page.click("input[type=submit]")
    page.wait_for_selector(".gallery")
    page.fill("#template-content-moderation input[name=name]", "our-moderation")
    page.click("#template-content-moderation input[type=submit]")
    page.wait_for_selector(".messagelist")

    page.click("text=Run…")  # on the workflow's page
    page.wait_for_selector("#run-form")
    sample = template_named("content-moderation").sample_input
    assert json.loads(page.input_value("#id_input")) == sample
    screenshot(page, "workflow-run")
    page.click("#run-form input[type=submit]")

    page.wait_for_url("**/live/")
    run = Run.objects.get(version__workflow__name="our-moderation")
    assert page.url.endswith(f"/admin/orchestrator/run/{run.id}/live/")
    assert run.input == sample
