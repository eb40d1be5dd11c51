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
