"""The visual workflow builder in a real browser (headless Chromium, docs/builder.md).

* An editor builds a three-step workflow with a human gate by drags and clicks alone — palette to
  canvas, fields of the side panel, edges drawn from step to step — saves it (after the diff) and
  starts a run of it from the page; real workers run it to the gate, a support lead approves
  through the API and the run completes.
* Every example and every gallery template, opened in the builder and saved without an edit,
  comes back as the identical definition (same digest: no new version) with its layout stored
  beside it.
* A cycle drawn on the canvas is refused on that edge; a cycle typed in the YAML view is marked
  by the server's problem on each of its edges.
"""
import json

import pytest

from approvals.models import ApprovalRequest
from orchestrator.engine.definitions import parse_definition_text
from orchestrator.engine.gallery import templates
from orchestrator.engine.hashing import digest_of
from orchestrator.engine.services.layouts import step_names
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role, Run, WorkflowVersion, WorkflowVersionLayout
from tests.conftest import client_for
from tests.factories import EXAMPLES, member

from .conftest import wait_for, wait_for_run

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]
NEW = "/admin/orchestrator/workflow/builder/"


@pytest.fixture
def editor(team):
    user = member(team, "editor", role=Role.EDITOR, staff=True)
    user.set_password("edit-pass-1")
    user.save()
    return user


def sign_in(page, web_server, next_url: str) -> None:
    page.goto(f"{web_server}/admin/login/?next={next_url}")
    page.fill("#id_username", "editor")
    page.fill("#id_password", "edit-pass-1")
    page.click("input[type=submit]")
    page.evaluate("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")


def open_builder(page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("#builder[data-ready=true]")


def tap(page, element: str) -> None:
    """Tap a step or an edge as a click on it would. The expression returns nothing: the
    collection `emit` returns would be serialized back by Playwright, which walks the whole
    Cytoscape graph from it (gigabytes of the page's heap, and then a crashed page)."""
    page.evaluate("(id) => { window.stepwiseBuilder.cy.getElementById(id).emit('tap'); }", element)


def node_point(page, name: str) -> dict:
    """Where step `name` is on the screen."""
    return page.evaluate("""(name) => {
        const node = window.stepwiseBuilder.cy.getElementById(name);
        const box = document.getElementById('canvas').getBoundingClientRect();
        const p = node.renderedPosition();
        return {x: box.left + p.x, y: box.top + p.y};
    }""", name)


def draw_edge(page, source: str, target: str) -> None:
    """Press on `source`, drag onto `target`, release: what a person does in connect mode."""
    start, end = node_point(page, source), node_point(page, target)
    page.mouse.move(start["x"], start["y"])
    page.mouse.down()
    page.mouse.move((start["x"] + end["x"]) / 2, (start["y"] + end["y"]) / 2, steps=6)
    page.mouse.move(end["x"], end["y"], steps=8)

    def on_target():
        # The extension marks the target once the pointer has rested on it; each small move is
        # another chance for its (throttled) pointer tracking to see where the pointer is.
        page.mouse.move(end["x"] + 1, end["y"] + 1)
        page.mouse.move(end["x"], end["y"])
        return page.evaluate("(name) => window.stepwiseBuilder.cy.getElementById(name).hasClass('eh-target')", target)

    wait_for(on_target, timeout=10, interval=0.1)
    page.mouse.up()


def drop_step(page, step_type: str, x: int, y: int) -> None:
    page.drag_and_drop(f"#palette-{step_type}", "#canvas", target_position={"x": x, "y": y})


def set_field(page, selector: str, value: str) -> None:
    page.fill(selector, value)
    page.press(selector, "Tab")  # the change event


def save(page) -> None:
    page.click("#btn-save")
    page.wait_for_selector("#save-dialog[open]")
    page.click("#btn-save-confirm")
    page.wait_for_function("document.getElementById('builder').dataset.savedVersion !== undefined")


def test_an_editor_builds_a_gated_workflow_by_dragging_saves_it_and_runs_it(
        browser_page, workers, web_server, team, editor, approver):
    page = browser_page
    sign_in(page, web_server, "/admin/orchestrator/workflow/")
    page.click("text=New workflow in the builder")
    page.wait_for_selector("#builder[data-ready=true]")

    set_field(page, "#field-workflow-name", "gated-echo")
    drop_step(page, "tool", 150, 250)
    set_field(page, "#field-step-name", "fetch")
    set_field(page, "#field-step-tool", "core.echo")
    set_field(page, "#field-step-params", "ticket: T-1")
    drop_step(page, "human_gate", 400, 250)
    set_field(page, "#field-step-name", "approve")
    set_field(page, "#field-step-approvers", "support_leads")
    drop_step(page, "tool", 650, 250)
    set_field(page, "#field-step-name", "send")
    set_field(page, "#field-step-tool", "core.echo")
    set_field(page, "#field-step-params", "sent: yes")

    page.click("#btn-connect")
    draw_edge(page, "fetch", "approve")
    draw_edge(page, "approve", "send")
    page.click("#btn-connect")
    assert page.evaluate("window.stepwiseBuilder.cy.edges().map(e => e.id())") == ["fetch->approve", "approve->send"]

    page.click("#btn-save")
    page.wait_for_selector("#save-dialog[open]")
    assert "gated-echo is a new workflow" in page.inner_text("#save-diff")
    for name in ("fetch", "approve", "send"):
        assert name in page.inner_text("#diff-added")
    page.click("#btn-save-confirm")
    page.wait_for_function("document.getElementById('builder').dataset.savedVersion === '1'")
    assert "Saved as gated-echo version 1" in page.inner_text("#builder-status")

    version = WorkflowVersion.objects.get(workflow__name="gated-echo", workflow__team=team)
    assert version.definition == {
        "name": "gated-echo", "input_schema": {"type": "object"},
        "steps": [{"name": "fetch", "type": "tool", "tool": "core.echo", "params": {"ticket": "T-1"}},
                  {"name": "approve", "type": "human_gate", "approvers": "support_leads", "after": ["fetch"]},
                  {"name": "send", "type": "tool", "tool": "core.echo", "params": {"sent": "yes"},
                   "after": ["approve"]}]}
    layout = WorkflowVersionLayout.objects.get(version=version)
    assert set(layout.positions) == {"fetch", "approve", "send"}
    assert layout.positions["fetch"]["x"] < layout.positions["approve"]["x"] < layout.positions["send"]["x"]

    page.click("#btn-run")
    page.wait_for_selector("#run-dialog[open]")
    page.fill("#run-input", "{}")
    page.click("#btn-run-confirm")
    page.wait_for_url("**/live/")
    run = Run.objects.get(version=version)
    assert run.created_by == editor
    waiting = wait_for_run(run.id, states=("waiting", "failed", "completed"), timeout=60)
    assert waiting.state == "waiting", waiting.error
    page.wait_for_selector("#run-state[data-state=waiting]")

    gate = ApprovalRequest.objects.get(run=run, step__name="approve", state="pending")
    answer = client_for(approver).post(f"/api/v1/approvals/{gate.id}/approve/",
                                       {"proposal_hash": gate.proposal_hash, "note": "fine"}, format="json")
    assert answer.status_code == 200, answer.json()
    assert wait_for_run(run.id, states=("completed", "failed"), timeout=60).state == "completed"
    page.wait_for_selector("#run-state[data-state=completed]")


def _saved_examples(team, owner) -> list[WorkflowVersion]:
    versions = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        version, _ = workflow_save(team=team, definition=parse_definition_text(path.read_text()), actor=owner)
        versions.append(version)
    return versions


def test_every_example_and_template_saves_back_identical_without_an_edit(
        browser_page, screenshot, web_server, team, editor):
    owner = member(team, "owner", role=Role.OWNER)
    examples = _saved_examples(team, owner)
    assert len(examples) == len(list(EXAMPLES.glob("*.yaml")))
    page = browser_page
    sign_in(page, web_server, "/admin/orchestrator/workflow/")
    for version in examples:
        open_builder(page, f"{web_server}/admin/orchestrator/workflow/{version.workflow_id}/builder/")
        drawn = set(page.evaluate("window.stepwiseBuilder.cy.nodes().map(n => n.id())"))
        assert drawn == step_names(version.definition), version
        if version.workflow.name == "content-moderation":
            # A router's routes are the labels of its edges.
            labels = page.evaluate("Object.fromEntries(window.stepwiseBuilder.cy.edges('[source = \"route\"]')"
                                   ".map(e => [e.target().id(), e.data('label')]))")
            assert labels == {"review": "uncertain", "publish": "uncertain / clear", "enforce": "violation"}
            tap(page, "route")
            page.wait_for_selector("#field-step-routes")
            screenshot(page, "builder")
        save(page)
        assert page.evaluate("document.getElementById('builder').dataset.savedCreated") == "false", (
            version, page.inner_text("#builder-status"))
        assert version.workflow.versions.count() == 1
        version.refresh_from_db()
        assert version.digest == digest_of(parse_definition_text(
            next(p for p in EXAMPLES.glob("*.yaml") if parse_definition_text(p.read_text())["name"]
                 == version.workflow.name).read_text()))
        # Every step drawn as a box of its own has its position stored; a loop with a body is
        # drawn around its body steps, so its place follows from theirs.
        boxes = set(page.evaluate("window.stepwiseBuilder.cy.nodes().filter(n => !n.isParent()).map(n => n.id())"))
        loops = {s["name"] for s in version.definition["steps"] if s["type"] == "loop" and s.get("body")}
        assert boxes == step_names(version.definition) - loops
        assert set(WorkflowVersionLayout.objects.get(version=version).positions) == boxes

    # The gallery's templates, opened unsaved, saved as new workflows under new names.
    for template in templates():
        open_builder(page, f"{web_server}{NEW}?team={team.slug}&template={template.name}")
        set_field(page, "#field-workflow-name", f"copy-{template.name}")
        save(page)
        assert page.evaluate("document.getElementById('builder').dataset.savedCreated") == "true"
        saved = WorkflowVersion.objects.get(workflow__name=f"copy-{template.name}")
        assert saved.definition == {**template.definition(), "name": f"copy-{template.name}"}
        assert saved.digest == digest_of({**template.definition(), "name": f"copy-{template.name}"})


def test_a_cycle_drawn_on_the_canvas_is_refused_on_that_edge(browser_page, screenshot, web_server, team, editor):
    version, _ = workflow_save(team=team, definition=parse_definition_text(
        (EXAMPLES / "support.yaml").read_text()), actor=editor)
    page = browser_page
    sign_in(page, web_server, "/admin/orchestrator/workflow/")
    open_builder(page, f"{web_server}/admin/orchestrator/workflow/{version.workflow_id}/builder/")
    before = page.evaluate("window.stepwiseBuilder.text()")
    tap(page, "approve")
    page.wait_for_selector("#field-step-approvers")

    page.click("#btn-connect")
    draw_edge(page, "send", "classify")
    screenshot(page, "builder-cycle")
    edge = "refused:send->classify"
    assert page.evaluate(f"window.stepwiseBuilder.cy.getElementById('{edge}').hasClass('refused')")
    message = page.inner_text("#refused-message")
    assert "cycle" in message and "classify → research → draft → approve → send → classify" in message
    assert page.evaluate("window.stepwiseBuilder.text()") == before  # the definition is unchanged

    # A cycle typed in the YAML view reaches the server, whose problem lands on its edges.
    page.click("#btn-connect")
    page.click("#tab-yaml")
    text = page.input_value("#yaml-text")
    text = text.replace("  - name: classify\n", "  - name: classify\n    after:\n      - send\n", 1)
    page.fill("#yaml-text", text)
    page.click("#tab-canvas")
    page.click("#btn-check")
    page.wait_for_function("window.stepwiseBuilder.cy.getElementById('send->classify').hasClass('has-error')")
    for edge in ("classify->research", "draft->approve", "approve->send", "send->classify"):
        assert page.evaluate(f"window.stepwiseBuilder.cy.getElementById('{edge}').hasClass('has-error')"), edge
    tap(page, "send->classify")
    assert "cycle: classify -> research -> draft -> approve -> send -> classify" in page.inner_text("#panel")
    assert WorkflowVersion.objects.filter(workflow=version.workflow).count() == 1
    assert json.loads(page.evaluate("window.stepwiseBuilder.text()"))["steps"][0]["after"] == ["send"]

    # A problem of one dependency (`steps[i].after[j]`) lands on that edge, a problem of a
    # field on the step; saving is refused with them.
    page.click("#tab-yaml")
    text = page.input_value("#yaml-text").replace("    after:\n      - send\n", "", 1)
    text = text.replace("    after:\n      - classify\n", "    after:\n      - classify\n      - classify\n", 1)
    text = text.replace("    tool: email.send\n", "    tool: email.sned\n", 1)
    page.fill("#yaml-text", text)
    page.click("#tab-canvas")
    page.click("#btn-save")
    page.wait_for_function("window.stepwiseBuilder.cy.getElementById('classify->research').hasClass('has-error')")
    assert page.evaluate("window.stepwiseBuilder.cy.getElementById('send').hasClass('has-error')")
    assert not page.evaluate("window.stepwiseBuilder.cy.getElementById('classify->fetch_history').hasClass('has-error')")
    assert "steps[1].after[1]" in page.inner_text("#workflow-errors")
    tap(page, "send")
    assert "steps[5].tool" in page.inner_text("#panel") and "email.sned" in page.inner_text("#panel")
    assert page.locator("#save-dialog[open]").count() == 0
    assert WorkflowVersion.objects.filter(workflow=version.workflow).count() == 1


def test_a_field_added_to_the_format_appears_in_the_side_panel_without_ui_work(
        browser_page, web_server, team, editor):
    """The panel is generated from the schema the page is given: a schema with two fields the
    format does not have yet (served through the same page, rewritten on its way) shows them,
    and editing them writes them into the step."""
    version, _ = workflow_save(team=team, definition=parse_definition_text(
        (EXAMPLES / "support.yaml").read_text()), actor=editor)
    page = browser_page
    sign_in(page, web_server, "/admin/orchestrator/workflow/")
    opening, closing = '<script id="builder-data" type="application/json">', "</script>"

    def with_new_fields(route):
        html = route.fetch().text()
        start = html.index(opening) + len(opening)
        end = html.index(closing, start)
        data = json.loads(html[start:end])
        data["schema"]["$defs"]["agent_step"]["properties"].update({
            "priority": {"type": "integer", "minimum": 1, "description": "How urgent the step is."},
            "labels": {"type": "array", "items": {"type": "string"}, "description": "Free labels."}})
        text = json.dumps(data).replace("<", "\\u003C").replace(">", "\\u003E").replace("&", "\\u0026")
        route.fulfill(body=html[:start] + text + html[end:], content_type="text/html; charset=utf-8")

    page.route("**/builder/", with_new_fields)
    open_builder(page, f"{web_server}/admin/orchestrator/workflow/{version.workflow_id}/builder/")
    tap(page, "classify")
    page.wait_for_selector("#field-step-priority")
    assert "How urgent the step is." in page.inner_text("[data-key=priority]")
    set_field(page, "#field-step-priority", "2")
    set_field(page, "#field-step-labels", "billing, urgent")
    step = json.loads(page.evaluate("window.stepwiseBuilder.text()"))["steps"][0]
    assert (step["name"], step["priority"], step["labels"]) == ("classify", 2, ["billing", "urgent"])
    assert "priority: 2" in page.input_value("#yaml-text")
    # A field the page is not told about (the real format) is not drawn.
    page.unroute("**/builder/")
    open_builder(page, f"{web_server}/admin/orchestrator/workflow/{version.workflow_id}/builder/")
    tap(page, "classify")
    page.wait_for_selector("#field-step-prompt")
    assert page.locator("#field-step-priority").count() == 0


def test_the_canvas_takes_the_width_new_steps_never_overlap_and_required_fields_come_first(
        browser_page, web_server, team, editor):
    page = browser_page
    sign_in(page, web_server, NEW)
    page.evaluate("localStorage.setItem('django.admin.navSidebarIsOpen', 'true')")  # even open
    open_builder(page, f"{web_server}{NEW}?template=support-reply")

    assert page.locator("#nav-sidebar").count() == 0
    assert page.locator("#canvas").bounding_box()["width"] >= 850  # of a 1440 px window

    for _ in range(4):
        page.click("#palette-tool")
    boxes = page.evaluate("""() => window.stepwiseBuilder.cy.nodes().filter((n) => !n.isParent())
        .map((n) => { const b = n.boundingBox(); return [n.id(), b.x1, b.y1, b.x2, b.y2]; })""")
    for i, (a, *box_a) in enumerate(boxes):
        for b, *box_b in boxes[i + 1:]:
            apart = (box_a[2] + 20 <= box_b[0] or box_b[2] + 20 <= box_a[0]
                     or box_a[3] + 20 <= box_b[1] or box_b[3] + 20 <= box_a[1])
            assert apart, f"{a} and {b} overlap"

    labels = page.locator("#panel .sf-row > label").all_inner_texts()  # the new tool step
    required = [label for label in labels if label.endswith(" *")]
    assert "tool *" in required
    assert labels[:len(required)] == required  # every required field before the optional ones


def test_an_editor_adds_a_sleep_from_the_palette_and_saves_it(browser_page, workers, web_server, team,
                                                              editor):
    page = browser_page
    sign_in(page, web_server, "/admin/orchestrator/workflow/")
    page.click("text=New workflow in the builder")
    page.wait_for_selector("#builder[data-ready=true]")

    set_field(page, "#field-workflow-name", "nap-then-echo")
    drop_step(page, "sleep", 150, 250)
    set_field(page, "#field-step-name", "nap")
    set_field(page, "#field-step-for_s", "30")
    drop_step(page, "tool", 400, 250)
    set_field(page, "#field-step-name", "echo")
    set_field(page, "#field-step-tool", "core.echo")
    page.click("#btn-connect")
    draw_edge(page, "nap", "echo")
    page.click("#btn-connect")
    save(page)

    version = WorkflowVersion.objects.get(workflow__name="nap-then-echo", workflow__team=team)
    assert version.definition["steps"] == [
        {"name": "nap", "type": "sleep", "for_s": 30},
        {"name": "echo", "type": "tool", "tool": "core.echo", "after": ["nap"]}]


def test_an_editor_adds_a_human_input_from_the_palette_and_saves_it(browser_page, screenshot,
                                                                    workers, web_server, team,
                                                                    editor):
    page = browser_page
    sign_in(page, web_server, "/admin/orchestrator/workflow/")
    page.click("text=New workflow in the builder")
    page.wait_for_selector("#builder[data-ready=true]")

    set_field(page, "#field-workflow-name", "ask-then-echo")
    drop_step(page, "human_input", 150, 250)
    set_field(page, "#field-step-name", "ask")
    set_field(page, "#field-step-group", "clerks")
    set_field(page, "#field-step-form",
              "type: object\nrequired: [iban]\nproperties:\n  iban: {type: string}")
    drop_step(page, "tool", 400, 250)
    set_field(page, "#field-step-name", "echo")
    set_field(page, "#field-step-tool", "core.echo")
    page.click("#btn-connect")
    draw_edge(page, "ask", "echo")
    page.click("#btn-connect")
    screenshot(page, "builder-human-input")
    save(page)

    version = WorkflowVersion.objects.get(workflow__name="ask-then-echo", workflow__team=team)
    assert version.definition["steps"] == [
        {"name": "ask", "type": "human_input", "group": "clerks",
         "form": {"type": "object", "required": ["iban"],
                  "properties": {"iban": {"type": "string"}}}},
        {"name": "echo", "type": "tool", "tool": "core.echo", "after": ["ask"]}]


def test_an_editor_adds_a_wait_for_a_signal_from_the_palette_and_saves_it(
        browser_page, workers, web_server, team, editor):
    page = browser_page
    sign_in(page, web_server, "/admin/orchestrator/workflow/")
    page.click("text=New workflow in the builder")
    page.wait_for_selector("#builder[data-ready=true]")

    set_field(page, "#field-workflow-name", "pay-then-echo")
    drop_step(page, "wait", 150, 250)
    set_field(page, "#field-step-name", "pay")
    set_field(page, "#field-step-signal", "paid")
    set_field(page, "#field-step-timeout_s", "600")
    drop_step(page, "tool", 400, 250)
    set_field(page, "#field-step-name", "echo")
    set_field(page, "#field-step-tool", "core.echo")
    page.click("#btn-connect")
    draw_edge(page, "pay", "echo")
    page.click("#btn-connect")
    save(page)

    version = WorkflowVersion.objects.get(workflow__name="pay-then-echo", workflow__team=team)
    assert version.definition["steps"] == [
        {"name": "pay", "type": "wait", "signal": "paid", "timeout_s": 600},
        {"name": "echo", "type": "tool", "tool": "core.echo", "after": ["pay"]}]
