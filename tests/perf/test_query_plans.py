"""Each list reads its page through its index, however long the history behind it: on a
PostgreSQL table of 20,000 runs (bench/history.py, the scale bench's seeding), analysed, the
query a list request actually sends is EXPLAINed, and its plan must scan the expected index and
no big table sequentially. A later change to a list's filter, ordering or visibility that falls
back to a scan (and a sort of every matching row) fails here, where a small table would hide it.

The same holds for the admin's changelists (every query the page sends, its filters' choices
and count included) and for the costs report, whose calls are read through their `finished_at`
index for the days not yet rolled up and from the daily totals for the rest.
"""
import json
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from bench.history import Shape, seed
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.web import admin_paging
from orchestrator.web.admin_paging import COUNT_CAP
from tests.factories import example_definition

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif("connection.vendor != 'postgresql'",
                       reason="query plans are PostgreSQL's (EXPLAIN); SQLite plans differently"),
]

BIG = {"orchestrator_run", "orchestrator_steprun", "orchestrator_event", "orchestrator_deadletter",
       "approvals_approvalrequest", "approvals_inputtask", "audit_entry", "orchestrator_stepattempt",
       "orchestrator_mapitem", "alerts_alert"}
# The history's runs are this far apart: 20,000 of them span 139 days, so a month's costs are a
# fifth of the calls and a day's a hundred-and-fortieth.
GAP_S = 600

LISTS = [
    # The member sees one team's runs, so the team's own ordered index serves the page as well.
    ("/api/v1/runs/", "orchestrator_run", "run_created_id run_team_created_id"),
    ("/api/v1/runs/?state=waiting", "orchestrator_run", "run_state_created_id"),
    ("/api/v1/approvals/", "approvals_approvalrequest", "approval_requested_id"),
    ("/api/v1/approvals/?state=pending", "approvals_approvalrequest", "approval_state_requested"),
    ("/api/v1/input-tasks/", "approvals_inputtask", "input_deadline_id"),
    ("/api/v1/input-tasks/?state=open", "approvals_inputtask", "input_state_deadline_id"),
    ("/api/v1/dead-letters/", "orchestrator_deadletter", "dead_letter_created_id"),
    ("/api/v1/dead-letters/?status=open", "orchestrator_deadletter", "dead_letter_status_created"),
]


@pytest.fixture
def history(team, requester):
    version, _ = workflow_save(team=team, definition=example_definition("support"),
                               actor=requester)
    with connection.cursor() as cursor:
        seed(cursor, Shape(runs=20_000, steps_per_run=1, events_per_run=1, entries_per_run=1,
                           waiting_every=100, dead_letter_every=10, alert_every=10,
                           seconds_between=GAP_S),
             team_id=team.id, version_id=version.id, user_id=requester.id)


def page_query(api, url: str, table: str) -> str:
    """The SELECT of the page the list answers `url` with (its LIMIT names the page)."""
    with CaptureQueriesContext(connection) as queries:
        response = api.get(url)
    assert response.status_code == 200, response.content
    [sql] = [q["sql"] for q in queries.captured_queries
             if q["sql"].startswith("SELECT") and f'FROM "{table}"' in q["sql"]
             and "LIMIT" in q["sql"]]
    return sql


def nodes_of(sql: str) -> list[dict]:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}")
        document = cursor.fetchone()[0]
    document = json.loads(document) if isinstance(document, str) else document
    found, todo = [], [document[0]["Plan"]]
    while todo:
        node = todo.pop()
        found.append(node)
        todo += node.get("Plans", [])
    return found


def assert_reads_its_index(sql: str, table: str, index: str) -> None:
    """`index` names the index the page must read through, or several the planner may pick
    between (each already in the list's order, so none needs a sort)."""
    nodes = nodes_of(sql)
    scans = [(n["Node Type"], n.get("Relation Name"), n.get("Index Name")) for n in nodes]
    assert any(n.get("Index Name") in index.split() and n.get("Relation Name") == table
               for n in nodes), "\n".join(map(str, scans))
    assert not [s for s in scans if s[0] == "Seq Scan" and s[1] in BIG], scans
    assert not [n for n in nodes if n["Node Type"] == "Sort"
                and any(n2.get("Relation Name") == table for n2 in nodes)
                and n.get("Plans", [{}])[0].get("Relation Name") == table], scans


@pytest.mark.parametrize("url, table, index", LISTS)
def test_each_list_reads_its_first_and_a_later_page_through_its_index(api, history, url, table,
                                                                      index):
    separator = "&" if "?" in url else "?"
    assert_reads_its_index(page_query(api, f"{url}{separator}limit=50", table), table, index)

    later = api.get(f"{url}{separator}limit=50").json()["next"]
    assert later, "a seeded list has more than one page"
    assert_reads_its_index(page_query(api, later, table), table, index)


# Each changelist's page query and the index it must read through (newest first).
CHANGELISTS = [
    ("/admin/orchestrator/run/", "orchestrator_run", "run_created_id"),
    ("/admin/orchestrator/steprun/", "orchestrator_steprun", "orchestrator_steprun_pkey"),
    ("/admin/orchestrator/event/", "orchestrator_event", "orchestrator_event_pkey"),
    ("/admin/orchestrator/deadletter/", "orchestrator_deadletter", "dead_letter_created_id"),
    ("/admin/approvals/approvalrequest/", "approvals_approvalrequest", "approval_state_deadline"),
    ("/admin/approvals/approvalrequest/?state=all", "approvals_approvalrequest",
     "approval_requested_id"),
    ("/admin/alerts/alert/", "alerts_alert", "alerts_alert_created_at_b399f504"),
    ("/admin/audit/auditentry/", "audit_entry", "audit_entry_pkey"),
]


@pytest.fixture
def site(history, django_user_model, monkeypatch):
    # The count cap scaled to the seeded table as the real one is to a history of millions: a
    # cap of half the table would let the planner read it whole, as it rightly would here.
    monkeypatch.setattr(admin_paging, "COUNT_CAP", 1_000)
    person = django_user_model.objects.create_superuser("plans-admin", "plans@example.com", "x")
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(person)
    return client


def queries_of(client, url: str) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200, response.content[:500]
    return [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT")]


def assert_bounded(sql: str) -> None:
    """No sequential scan of a big table and no sort of more than a page's rows of one (a
    top-N sort of a whole table is the plan of an order no index serves). A table the seeding
    leaves within the changelist's count cap (dead letters, alerts) may be read whole: its
    capped count reads at most as many rows either way."""
    nodes = nodes_of(sql)
    scans = [(n["Node Type"], n.get("Relation Name"), n.get("Index Name")) for n in nodes]
    assert not [s for s in scans if s[0] == "Seq Scan" and s[1] in BIG
                and rows_in(s[1]) > COUNT_CAP + 1], (sql, scans)
    assert not [n for n in nodes if n["Node Type"] == "Sort" and n["Plan Rows"] > 1000
                and any(rows_in(table) > COUNT_CAP + 1 for table in _big_under(n))], (sql, scans)


def rows_in(table: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples FROM pg_class WHERE relname = %s", [table])
        return cursor.fetchone()[0]


def _big_under(node: dict) -> set[str]:
    found, todo = set(), [node]
    while todo:
        node = todo.pop()
        if node.get("Relation Name") in BIG:
            found.add(node["Relation Name"])
        todo += node.get("Plans", [])
    return found


@pytest.mark.parametrize("url, table, index", CHANGELISTS)
def test_each_changelist_reads_its_page_through_its_index_and_nothing_whole(site, url, table,
                                                                           index):
    queries = queries_of(site, url)
    pages = [sql for sql in queries if f'FROM "{table}"' in sql and "LIMIT 100" in sql
             and not sql.startswith("SELECT COUNT")]
    assert pages, queries
    assert_reads_its_index(pages[0], table, index)
    for sql in queries:  # its count, its filters' choices, what each row shows
        assert_bounded(sql)


@pytest.mark.parametrize("url", ["/api/v1/costs/?group_by=day", "/api/v1/costs/?group_by=model",
                                 "/api/v1/costs/?group_by=run&from={yesterday}",
                                 "/admin/budgets/costreport/"])
def test_the_costs_report_reads_its_days_not_the_history(api, site, url):
    """Grouped by run, the report is as long as the range has runs: it is read over two days."""
    from orchestrator.engine.clock import now

    url = url.format(yesterday=(now() - timedelta(days=1)).date())
    client = site if url.startswith("/admin/") else api
    queries_of(client, url)  # the first report of the month writes its days' totals
    queries = queries_of(client, url)
    calls = [sql for sql in queries if 'FROM "orchestrator_stepattempt"' in sql]
    assert calls, queries
    for sql in calls:
        assert_reads_its_index(sql, "orchestrator_stepattempt", "attempt_finished")
    for sql in queries:
        assert_bounded(sql)


def test_a_day_is_rolled_up_once_through_the_calls_index(api, history):
    from orchestrator.engine.clock import now

    url = "/api/v1/costs/?from={0}&to={0}".format((now() - timedelta(days=3)).date())
    with CaptureQueriesContext(connection) as queries:
        first = api.get(url)
    rolled = [q["sql"] for q in queries.captured_queries
              if q["sql"].startswith("SELECT") and 'FROM "orchestrator_stepattempt"' in q["sql"]]
    assert rolled, "the day's calls were read"
    for sql in rolled:
        assert_reads_its_index(sql, "orchestrator_stepattempt", "attempt_finished")
    assert first.json()["rows"][0]["calls"] > 0

    again = queries_of(api, url)
    assert not [sql for sql in again if 'FROM "orchestrator_stepattempt"' in sql]
    assert api.get(url).json() == first.json()
