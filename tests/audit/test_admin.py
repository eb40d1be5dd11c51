"""Browsing: a read-only ledger admin with filters, and a run timeline that explains a run."""
import pytest
from django.contrib.auth.models import Group, User

from audit.models import AuditEntry

from .conftest import ledger, tamper

pytestmark = pytest.mark.django_db
CHANGELIST = "/admin/audit/auditentry/"


def timeline_url(run) -> str:
    return f"{CHANGELIST}run/{run.id}/"


@pytest.fixture
def superuser_client(client):
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


@pytest.fixture
def auditor_client(client):
    """A compliance reviewer: a staff account in `auditors`, with no model permission."""
    auditor = User.objects.create_user("auditor", is_staff=True)
    auditor.groups.add(Group.objects.get_or_create(name="auditors")[0])
    client.force_login(auditor)
    return client


@pytest.mark.parametrize("query", [
    "", "?action=step.completed", "?actor_kind=worker", "?actor=approver", "?workflow=support-reply",
    "?subject_type=approval", "?outcome=completed", "?created_at__year={year}", "?q=email.send",
])
def test_the_ledger_lists_and_filters(superuser_client, support_run, query):
    response = superuser_client.get(CHANGELIST + query.format(year=support_run.created_at.year))
    assert response.status_code == 200


def test_filtering_by_run_shows_only_that_runs_entries(superuser_client, support_run, team, requester):
    from orchestrator.engine.services.runs import run_start

    from .conftest import SUPPORT_INPUT

    other = run_start(version=support_run.version, input={**SUPPORT_INPUT, "ticket_id": "T-9"}, actor=requester)
    response = superuser_client.get(f"{CHANGELIST}?run={support_run.id}")

    shown = response.context["cl"].result_count
    assert shown == AuditEntry.objects.filter(run_id=support_run.id).count()
    assert other.id not in {e.run_id for e in response.context["cl"].result_list}


def test_the_ledger_lists_the_newest_entries_first(auditor_client, support_run):
    from audit.chain import seal_pending
    seal_pending()
    newest = AuditEntry.objects.order_by("-id").values_list("id", flat=True).first()
    shown = list(auditor_client.get(CHANGELIST).context["cl"].result_list)

    # Newest written first: a sequence counts within one shard only, so the list reads the ids
    # (others may write while the page is read, so the newest is at or after the one seen before).
    assert shown[0].id >= newest
    assert [e.id for e in shown] == sorted((e.id for e in shown), reverse=True)


def test_the_run_and_actor_filters_offer_the_newest_values_to_pick(auditor_client, support_run):
    html = auditor_client.get(CHANGELIST).content.decode()

    assert 'list="run-recent"' in html and 'list="actor-recent"' in html
    assert f'<option value="{support_run.id}">support-reply {str(support_run.id)[:8]}</option>' in html
    assert '<option value="user:approver">' in html or "approver" in html.split('id="actor-recent"')[1]


def test_an_entry_page_shows_its_redacted_payload_and_integrity(auditor_client, support_run):
    entry = ledger(run_id=support_run.id, action="approval.approved")[0]
    response = auditor_client.get(f"{CHANGELIST}{entry.pk}/change/")

    assert response.status_code == 200
    page = response.content.decode()
    assert "Offer a voucher" in page and "digest and hash match" in page


def test_nobody_may_add_change_or_delete_an_entry(superuser_client, support_run):
    entry = ledger(run_id=support_run.id)[0]

    assert superuser_client.get(f"{CHANGELIST}add/").status_code == 403
    assert superuser_client.post(f"{CHANGELIST}{entry.pk}/change/", {"outcome": "x"}).status_code == 403
    assert superuser_client.get(f"{CHANGELIST}{entry.pk}/delete/").status_code == 403
    assert superuser_client.post(CHANGELIST, {"action": "delete_selected",
                                              "_selected_action": [entry.pk]}).status_code in (200, 302)
    assert AuditEntry.objects.filter(pk=entry.pk, outcome=entry.outcome).exists()


@pytest.mark.parametrize("staff, superuser, group, allowed", [
    (True, False, "auditors", True), (True, True, None, True), (True, False, None, False),
    (False, False, "auditors", False), (False, False, None, False),
])
def test_access_is_limited_to_auditors_and_superusers(client, support_run, staff, superuser, group,
                                                       allowed):
    user = User.objects.create_user("someone", is_staff=staff, is_superuser=superuser)
    if group:
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    client.force_login(user)

    for url in (CHANGELIST, timeline_url(support_run)):
        response = client.get(url)
        assert (response.status_code == 200) is allowed, url
        if not allowed and not staff:
            assert response.status_code == 302 and "/login/" in response["Location"]
        elif not allowed:  # staff, but being staff grants nothing by itself
            assert response.status_code == 403, url


def test_the_timeline_explains_a_finished_support_run(auditor_client, support_run):
    response = auditor_client.get(timeline_url(support_run))

    assert response.status_code == 200
    page = response.content.decode()
    # What started it, with which versions and data.
    assert "Started by user:requester via api" in page
    assert f"workflow support-reply v{support_run.version.number}" in page
    assert support_run.version.digest in page
    assert "carol.customer@example.com" in page  # not declared sensitive in this workflow
    # Which policy applied, who approved, which calls were made, how it ended.
    assert "support_leads" in page
    assert "Approved by user:approver" in page and "Offer a voucher" in page
    assert "Authorized a tool call to email.send" in page
    assert "Authorized a model call to scripted:deep" in page
    assert "Run completed" in page
    # Why every step happened.
    timeline = response.context["timeline"]
    why = {story.name: story.why for story in timeline.steps}
    assert why["classify"] == "Ready: it waits for nothing, which finished."
    assert "it waits for research, fetch_history" in why["draft"]
    assert "`steps.classify.output.category != 'spam'` held" in why["research"]
    assert {story.name: story.outcome for story in timeline.steps} == {
        "classify": "completed", "research": "completed", "fetch_history": "completed",
        "draft": "completed", "approve": "completed", "send": "completed"}
    assert all(call.outcome is not None for call in timeline.calls)
    assert timeline.broken == []


def test_the_timeline_flags_an_altered_entry(auditor_client, support_run):
    entry = ledger(run_id=support_run.id, action="approval.approved")[0]
    tamper("UPDATE audit_entry SET actor = 'user:mallory' WHERE id = %s", [entry.id])

    page = auditor_client.get(timeline_url(support_run)).content.decode()

    assert "do not match their digest or hash" in page and "altered" in page


def test_a_run_without_entries_has_an_empty_timeline(auditor_client):
    import uuid

    response = auditor_client.get(f"{CHANGELIST}run/{uuid.uuid4()}/")
    assert response.status_code == 200 and "holds no entry" in response.content.decode()
