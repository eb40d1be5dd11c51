"""The admin's changelists over tables that grow with history count no whole table: the
filtered count reads at most COUNT_CAP + 1 rows and the unfiltered one is not taken."""
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from orchestrator.web.admin_paging import COUNT_CAP

from .driving import drive_to_gate, support_run

pytestmark = pytest.mark.django_db

CHANGELISTS = [("/admin/orchestrator/run/", "orchestrator_run"),
               ("/admin/orchestrator/steprun/", "orchestrator_steprun"),
               ("/admin/orchestrator/event/", "orchestrator_event"),
               ("/admin/orchestrator/deadletter/", "orchestrator_deadletter"),
               ("/admin/approvals/approvalrequest/", "approvals_approvalrequest"),
               ("/admin/approvals/inputtask/", "approvals_inputtask"),
               ("/admin/audit/auditentry/", "audit_entry")]


@pytest.mark.parametrize("url, table", CHANGELISTS)
def test_a_changelist_counts_at_most_its_cap(admin_client, team, requester, url, table):
    drive_to_gate(support_run(team, requester))

    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(url)

    assert response.status_code == 200
    sql = [q["sql"] for q in queries.captured_queries]
    listed = [q for q in sql if q.startswith(f'SELECT COUNT(*) FROM (SELECT "{table}".')]
    whole = [q for q in sql if q.startswith(f'SELECT COUNT(*) AS "__count" FROM "{table}"')
             and " WHERE " not in q]
    assert listed and all(f"LIMIT {COUNT_CAP + 1}" in q for q in listed), listed
    assert not whole, whole


DOCUMENTS = ['"orchestrator_run"."input"', '"orchestrator_run"."output"',
             '"orchestrator_workflowversion"."definition"', '"orchestrator_workflowversion"."normalized"',
             '"orchestrator_steprun"."input"', '"orchestrator_steprun"."output"']


@pytest.mark.parametrize("url, table", CHANGELISTS[:5])
def test_a_changelist_reads_no_document_of_its_rows_or_of_the_rows_it_joins(admin_client, team, requester,
                                                                             url, table):
    # Each would be parsed for every row of every page, and none is a column of the list.
    drive_to_gate(support_run(team, requester))

    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(url)

    assert response.status_code == 200
    pages = [q["sql"] for q in queries.captured_queries
             if q["sql"].startswith("SELECT ") and f' FROM "{table}" ' in q["sql"]
             and "COUNT(" not in q["sql"] and " ORDER BY " in q["sql"]]
    assert pages
    assert [d for page in pages for d in DOCUMENTS if d in page.split(f' FROM "{table}" ')[0]] == []
