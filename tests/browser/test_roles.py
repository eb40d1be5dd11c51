"""Every role walks every admin page it can reach, in a real browser, and nothing is wrong.

Signed in as each role — a reviewer who is not staff, a member, an editor, an operator, an
owner, an auditor and a superuser — the walk starts at the admin index, follows each link it
offers inside the admin (each app and model, the custom pages), and on each model's list opens
its first object and its add page when the role is offered one. It fails on any console error
or uncaught exception, any answer of 400 or more, any request to a host other than the test
server, and any row of the run list whose cells differ from the API's answer for that run as
that person, read after the list's live script has re-read its rows.

One server, one browser and one set of data serve every role; the problems of all roles are
reported together.
"""
import time
from datetime import UTC, datetime
from urllib.parse import urljoin, urlsplit

import pytest
from django.contrib.auth.models import Group, User

from orchestrator.admin import _seconds
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role
from tests.conftest import client_for
from tests.factories import SETUP, example_definition, member
from triggers.services.config import trigger_create, trigger_update
from triggers.services.schedules import schedule_tick

from .conftest import wait_for_run

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

PASSWORD = "walk-the-pages-1"
TICKET = {"ticket_id": "T-1001", "customer_email": "sam@example.com",
          "body": "Hello, I was charged twice for my March invoice (INV-2291)."}
ECHO = {"name": "quick-echo", "description": "One tool step, done at once.",
        "input_schema": {"type": "object"},
        "steps": [{"name": "say", "type": "tool", "tool": "core.echo", "params": {"said": "hi"}}]}
# Pages a walk never follows: signing out ends the walk, and these change state on a GET.
NEVER = ("/admin/logout/", "/admin/password_change/")


def person(team, username: str, *, role: str | None = None, staff: bool = True,
           groups: tuple[str, ...] = (), superuser: bool = False) -> User:
    if role is None:
        user = User.objects.create_user(username, is_staff=staff, is_superuser=superuser)
        user.groups.add(*(Group.objects.get_or_create(name=name)[0] for name in groups))
    else:
        user = member(team, username, role=role, staff=staff, groups=groups)
    user.set_password(PASSWORD)
    user.save()
    return user


@pytest.fixture
def everyone(team):
    """A person of each role, and runs in several states started several ways."""
    people = {
        "reviewer": person(team, "rita_reviewer", role=Role.MEMBER, staff=False,
                           groups=("support_leads",)),
        "member": person(team, "mo_member", role=Role.MEMBER),
        "editor": person(team, "ed_editor", role=Role.EDITOR),
        "operator": person(team, "olga_operator", role=Role.OPERATOR),
        "owner": person(team, "owen_owner", role=Role.OWNER),
        "auditor": person(team, "audrey_auditor", groups=("auditors",)),
        "superuser": person(team, "sue_super", superuser=True),
    }
    support, _ = workflow_save(team=team, definition=example_definition("support"), actor=SETUP)
    echo, _ = workflow_save(team=team, definition=ECHO, actor=SETUP)
    waiting = run_start(version=support, input=TICKET, actor=people["editor"])
    done = run_start(version=echo, input={"n": 1}, actor=people["operator"])
    trigger_create(team=team, kind="webhook", name="tickets", workflow="support-reply",
                   actor=SETUP, input_template={"ticket_id": "{{ payload.ticket }}",
                                                "body": "{{ payload.text }}",
                                                "customer_email": "{{ payload.email }}"})
    schedule, _ = trigger_create(team=team, kind="schedule", name="every-second",
                                 workflow="quick-echo", actor=SETUP, interval_s=1,
                                 input_template={"slot": "{{ slot }}"})
    time.sleep(1.2)
    [fired] = schedule_tick(trigger_id=schedule.id)
    trigger_update(trigger_id=schedule.id, actor=SETUP, changes={"enabled": False})
    wait_for_run(waiting.id, states=("waiting",), timeout=60)
    wait_for_run(done.id, states=("completed",), timeout=60)
    wait_for_run(fired.run.id, states=("completed",), timeout=60)
    return people


class Walk:
    """What one signed-in person's pages did wrong, as they were visited."""

    def __init__(self, page, server: str, role: str):
        self.page, self.server, self.role = page, server, role
        self.host = urlsplit(server).netloc
        self.problems: list[str] = []
        self.where = "sign-in"
        page.on("console", self._console)
        page.on("pageerror", lambda error: self._add(f"uncaught exception: {error}"))
        page.on("request", self._request)
        page.on("response", self._response)

    def _add(self, problem: str) -> None:
        self.problems.append(f"{self.role} at {self.where}: {problem}")

    def _console(self, message) -> None:
        if message.type == "error":
            self._add(f"console error: {message.text}")

    def _request(self, request) -> None:
        if urlsplit(request.url).scheme in ("data", "blob", "about"):
            return
        if urlsplit(request.url).netloc != self.host:
            self._add(f"request to another host: {request.method} {request.url}")

    def _response(self, response) -> None:
        if response.status >= 400:
            self._add(f"{response.status} for {response.request.method} {response.url}")

    def visit(self, path: str) -> None:
        self.where = path
        answer = self.page.goto(urljoin(self.server, path), wait_until="load")
        if answer is None:
            self._add("no answer")

    def links(self, selector: str) -> list[str]:
        hrefs = self.page.eval_on_selector_all(selector, "els => els.map(a => a.getAttribute('href'))")
        found = []
        for href in hrefs:
            if not href or href.startswith(("#", "javascript:", "mailto:")):
                continue
            path = urlsplit(urljoin(self.page.url, href))
            if path.netloc != self.host or not path.path.startswith("/admin/"):
                continue
            if path.path.startswith(NEVER):
                continue
            found.append(path.path + (f"?{path.query}" if path.query else ""))
        return found


def sign_in(walk: Walk, username: str) -> None:
    page = walk.page
    walk.visit("/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    with page.expect_navigation(timeout=30000):  # a shared machine may be slow to answer
        page.click("input[type=submit]")
    page.wait_for_url(f"{walk.server}/admin/", timeout=30000)


def run_rows_match_the_api(walk: Walk, api, *, settle_s: float = 5) -> int:
    """Compare each run row, once the live script has re-read the rows, with the API's answer.
    A run that changed a moment ago (a cancelled parent's child) may reach the page a nudge
    later: the rows are read again until they match or `settle_s` has passed."""
    page = walk.page
    page.wait_for_selector("#live-status.live-live")
    page.wait_for_selector("#run-counts div")  # the counts are re-read first, then the rows
    page.wait_for_load_state("networkidle")
    deadline = time.monotonic() + settle_s
    while True:
        mismatches, count = _run_row_mismatches(page, api)
        if not mismatches or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    for mismatch in mismatches:
        walk._add(mismatch)
    return count


def _run_row_mismatches(page, api) -> tuple[list[str], int]:
    mismatches = []
    rows = page.eval_on_selector_all("#result_list tbody tr", r"""rows => rows.map(row => {
        const cell = name => row.querySelector('.field-' + name);
        const text = name => cell(name) ? cell(name).innerText.trim() : null;
        const found = row.querySelector('a[href*="/admin/orchestrator/run/"]')?.getAttribute('href')
            .match(/\/admin\/orchestrator\/run\/([0-9a-f-]{36})\/change\//);
        return {id: found ? found[1] : null,
                workflow: text('workflow'), version: text('version_number'), team: text('team'),
                state: text('state_badge'), cost: text('cost_usd'),
                trigger: text('trigger_column'), started_by: text('started_by'),
                created: cell('created')?.querySelector('time')?.getAttribute('title') ?? null,
                duration: text('duration')};
    })""")
    for row in rows:
        if row["id"] is None:
            mismatches.append(f"a run row without a link to its run: {row}")
            continue
        run = api.get(f"/api/v1/runs/{row['id']}/").json()
        people = (run.get("provenance") or {}).get("people") or []
        created = datetime.fromisoformat(run["created_at"].replace("Z", "+00:00")).astimezone(UTC)
        expected = {"id": run["id"], "workflow": run["workflow"], "version": str(run["version"]),
                    "team": run["team"], "state": run["state"].replace("_", " "),
                    "cost": run["cost_usd"], "trigger": run["trigger"],
                    "started_by": ", ".join(p["username"] for p in people) or run["created_by"] or (
                        f"trigger {run['started_by']['name']}" if run["started_by"] else
                        "parent run" if run["parent_run"] else "-"),
                    "created": created.strftime("%Y-%m-%d %H:%M:%S UTC"),
                    "duration": row["duration"] if run["duration_s"] is None
                    else _seconds(run["duration_s"])}
        shown = {**row, "trigger": (row["trigger"] or "").split(" ")[0]}
        if shown != expected:
            mismatches.append(f"run row {row['id']} shows {shown}, the API says {expected}")
    return mismatches, len(rows)


def walk_as(browser, web_server: str, role: str, user: User) -> tuple[list[str], set[str], int]:
    """Every page `user` reaches from the admin index; (problems, pages visited, run rows)."""
    context = browser.new_context(viewport={"width": 1440, "height": 900}, locale="en-US")
    page = context.new_page()
    page.set_default_timeout(30_000)
    walk = Walk(page, web_server, role)
    api = client_for(user)
    seen: set[str] = set()
    run_rows = 0
    try:
        sign_in(walk, user.username)
        seen.add("/admin/")
        todo = walk.links("#content a[href], #nav-sidebar a[href], #user-tools a[href]")
        changelists: list[str] = []
        while todo:
            path = todo.pop(0)
            if path in seen:
                continue
            seen.add(path)
            walk.visit(path)
            if page.query_selector("#changelist") and "?" not in path:
                changelists.append(path)
                if path == "/admin/orchestrator/run/":
                    run_rows += run_rows_match_the_api(walk, api)
                # The first object's every link (its page, its live page, ...) and the add pages.
                todo += [link for link in walk.links("#result_list tbody tr:first-child a[href]")
                         + walk.links(".object-tools a[href]") if link not in seen]
            elif path.count("/") == 3:  # an app's index: its models
                todo += [link for link in walk.links("#content-main a[href]") if link not in seen]
        assert changelists, f"{role} reached no list at all"
    finally:
        context.close()
    return walk.problems, seen, run_rows


def test_every_role_walks_every_admin_page_it_reaches_without_a_fault(
        browser, workers, web_server, team, everyone):
    problems, reached = [], {}
    for role, user in everyone.items():
        started = time.monotonic()
        found, pages, run_rows = walk_as(browser, web_server, role, user)
        print(f"{role}: {len(pages)} pages in {time.monotonic() - started:.0f} s")
        problems += found
        reached[role] = (len(pages), run_rows)
    # Every staff role of the team compared its three runs with the API (the auditor is in no
    # team and sees the ledger; the reviewer's own test opens the run list it may not be offered).
    rows = {role: rows for role, (_, rows) in reached.items() if role != "reviewer"}
    assert rows == {"member": 3, "editor": 3, "operator": 3, "owner": 3, "auditor": 0,
                    "superuser": 3}, reached
    assert not problems, "\n".join(problems)


def test_a_reviewer_sees_each_run_row_as_the_api_does_as_runs_change(
        browser_page, workers, web_server, team, everyone):
    """The list's live script re-reads the rows on connect and on each nudge: a reviewer who is
    not staff, offered only what a member may do (re-run: a start), sees each row keep its own
    run."""
    reviewer = everyone["reviewer"]
    walk = Walk(browser_page, web_server, "reviewer")
    sign_in(walk, reviewer.username)
    walk.visit("/admin/orchestrator/run/")
    offered = browser_page.eval_on_selector_all("select[name=action] option", "os => os.map(o => o.value)")
    assert offered == ["", "rerun_runs"]  # no cancel, no move: a member operates nothing
    api = client_for(reviewer)
    assert run_rows_match_the_api(walk, api) == 3

    waiting = api.get("/api/v1/runs/?state=waiting").json()["results"][0]["id"]
    cancelled = client_for(everyone["operator"]).post(f"/api/v1/runs/{waiting}/cancel/")
    assert cancelled.status_code == 202, cancelled.json()
    browser_page.wait_for_function(
        "id => document.querySelector(`[data-run-id='${id}']`).closest('tr')"
        ".querySelector('.field-state_badge').innerText.trim() === 'cancelled'", arg=waiting)
    assert run_rows_match_the_api(walk, api) == 3
    assert not walk.problems, "\n".join(walk.problems)
