"""Bulk re-runs through the services (`services.reruns`), the steps driven in this process as a
worker would: what a batch selects and refuses when asked, and what its worker starts and
refuses per source run. The real workers' part is tests/integration/test_reruns.py."""
import pytest
from django.db.models import Max

from audit.models import AuditEntry
from budgets.models import BudgetLimit
from orchestrator.engine.errors import Forbidden, IdempotencyConflict, InputInvalid
from orchestrator.engine.secret_inputs import revealed_for
from orchestrator.engine.services.reruns import rerun_advance, run_key, runs_rerun
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_archive, workflow_save
from orchestrator.models import Event, Rerun, RerunItem, Role, Run, RunSecret, TeamMembership
from tests.factories import SETUP, TeamFactory, member
from tests.support.reruns import SCHEMA, echo_definition, failed_runs, run_to_end


@pytest.fixture
def versions(team):
    broken, _ = workflow_save(team=team, definition=echo_definition(fixed=False), actor=SETUP)
    fixed, _ = workflow_save(team=team, definition=echo_definition(fixed=True), actor=SETUP)
    return broken, fixed


def advance_to_end(rerun: Rerun) -> Rerun:
    for _ in range(100):
        rerun = rerun_advance(rerun_id=rerun.id)
        if rerun.state == "done":
            return rerun
    raise AssertionError("the re-run did not end")


def test_a_rerun_starts_each_source_again_with_its_input_on_the_chosen_version(versions, requester):
    before = AuditEntry.objects.aggregate(newest=Max("id"))["newest"] or 0  # earlier tests' stay
    broken, fixed = versions
    sources = failed_runs(broken, 3)

    rerun = runs_rerun(run_ids=[r.id for r in sources], version=fixed, actor=requester, key="fix-1")
    assert rerun._created and (rerun.state, rerun.total, rerun.started) == ("running", 3, 0)
    rerun = advance_to_end(rerun)

    assert (rerun.total, rerun.started, rerun.refused) == (3, 3, 0)
    items = list(rerun.items.select_related("new_run"))
    assert [i.source_run_id for i in items] == [r.id for r in sources]
    for item, source in zip(items, sources, strict=True):
        new = item.new_run
        assert (item.outcome, new.version_id, new.input) == ("started", fixed.id, source.input)
        assert (new.trigger, new.created_by, new.idempotency_key) == ("rerun", requester,
                                                                      run_key(rerun, source.id))
        assert new.provenance == {"path": "rerun", "people": [
            {"user": requester.pk, "username": "requester", "as": "started it"}]}
        created = Event.objects.get(run=new, kind="run.created")
        assert created.payload["origin"] == {"rerun": rerun.id, "source_run": str(source.id)}
        assert run_to_end(new).state == "completed"
    assert list(AuditEntry.objects.filter(subject_type="rerun", id__gt=before).values_list("action", flat=True)
                .order_by("id")) == ["rerun.requested", "rerun.done"]


def test_the_same_key_returns_the_same_batch_and_starts_nothing_twice(versions, requester):
    broken, fixed = versions
    ids = [r.id for r in failed_runs(broken, 2)]
    first = runs_rerun(run_ids=ids, version=fixed, actor=requester, key="click")
    advance_to_end(first)

    again = runs_rerun(run_ids=list(reversed(ids)) + ids[:1], version=fixed, actor=requester, key="click")

    assert (again.id, again._created) == (first.id, False)
    assert Run.objects.filter(version=fixed).count() == 2
    # A replayed message after the end starts nothing either.
    assert rerun_advance(rerun_id=first.id).started == 2
    assert Run.objects.filter(version=fixed).count() == 2
    with pytest.raises(IdempotencyConflict):
        runs_rerun(run_ids=ids[:1], version=fixed, actor=requester, key="click")


def test_a_replayed_chunk_starts_no_source_twice(versions, requester):
    broken, fixed = versions
    sources = failed_runs(broken, 2)
    rerun = runs_rerun(run_ids=[r.id for r in sources], version=fixed, actor=requester, key="k")
    rerun_advance(rerun_id=rerun.id)
    # The worker died after starting the runs, before recording them: the next message finds
    # the items pending again and starts the same runs by their keys.
    RerunItem.objects.filter(rerun=rerun).update(outcome="pending", new_run=None)
    rerun = advance_to_end(rerun)

    assert (rerun.started, Run.objects.filter(version=fixed).count()) == (2, 2)


def test_a_filter_selects_the_workflows_runs_matching_it(versions, requester, team):
    broken, fixed = versions
    failed = failed_runs(broken, 2)
    run_to_end(run_start(version=fixed, input={"ticket": "ok"}, actor=SETUP))  # completed
    other, _ = workflow_save(team=team, definition=echo_definition(fixed=False, name="other"), actor=SETUP)
    failed_runs(other, 1)

    rerun = runs_rerun(filters={"state": ["failed"]}, version=fixed, actor=requester, key="f")

    assert set(rerun.items.values_list("source_run_id", flat=True)) == {r.id for r in failed}
    assert rerun.selection == {"filter": {"state": ["failed"]}}


@pytest.mark.parametrize(("asked", "path"), [
    ({}, "runs"),
    ({"run_ids": [], "filters": {}}, "runs"),
    ({"run_ids": ["not-an-id"]}, "runs[0]"),
    ({"filters": {"state": ["gone"]}}, "filter.state"),
    ({"filters": {"owner": "me"}}, "filter.owner"),
    ({"filters": {"workflow": "other"}}, "filter.workflow"),
    ({"filters": {"created_after": "yesterday"}}, "filter.created_after"),
    ({"filters": {"state": ["completed"]}}, "filter"),
])
def test_a_request_that_selects_nothing_clearly_is_refused_by_path(versions, requester, asked, path):
    broken, fixed = versions
    failed_runs(broken, 1)
    with pytest.raises(InputInvalid) as refused:
        runs_rerun(**asked, version=fixed, actor=requester, key="k")
    assert path in [p["path"] for p in refused.value.problems]
    assert not Rerun.objects.exists()


def test_runs_of_another_workflow_are_refused_naming_each(versions, requester, team):
    broken, fixed = versions
    mine = failed_runs(broken, 1)
    other, _ = workflow_save(team=team, definition=echo_definition(fixed=False, name="other"), actor=SETUP)
    theirs = failed_runs(other, 1)

    with pytest.raises(InputInvalid) as refused:
        runs_rerun(run_ids=[mine[0].id, theirs[0].id], version=fixed, actor=requester, key="k")

    assert refused.value.problems == [{"path": "runs[1]", "message": f"run {theirs[0].id} is a run "
                                       "of 'other', not of 'triage': re-run one workflow's runs at a time"}]


def test_another_teams_runs_are_not_reachable(versions, requester, outsider):
    broken, fixed = versions
    sources = failed_runs(broken, 1)
    theirs, _ = workflow_save(team=outsider.teams.get(), definition=echo_definition(fixed=True),
                              actor=SETUP)

    with pytest.raises(Forbidden):  # the support team's version: not a member
        runs_rerun(run_ids=[sources[0].id], version=fixed, actor=outsider, key="k")
    with pytest.raises(InputInvalid) as refused:  # their own version, our run: no such run
        runs_rerun(run_ids=[sources[0].id], version=theirs, actor=outsider, key="k")
    assert refused.value.problems[0]["message"] == f"no run {sources[0].id} among your teams' runs"
    assert not Rerun.objects.exists()


def test_a_member_without_run_start_is_refused(versions, team):
    broken, fixed = versions
    sources = failed_runs(broken, 1)
    inactive = member(team, "left", role=Role.MEMBER)
    inactive.is_active = False
    inactive.save()

    with pytest.raises(Forbidden):
        runs_rerun(run_ids=[sources[0].id], version=fixed, actor=inactive, key="k")


def test_a_person_who_loses_run_start_before_the_worker_starts_is_refused_per_source(versions, team):
    broken, fixed = versions
    sources = failed_runs(broken, 2)
    leaving = member(team, "leaving", role=Role.MEMBER)
    rerun = runs_rerun(run_ids=[r.id for r in sources], version=fixed, actor=leaving, key="k")
    TeamMembership.objects.filter(user=leaving).delete()

    rerun = advance_to_end(rerun)

    assert (rerun.started, rerun.refused) == (0, 2)
    assert {i.reason for i in rerun.items.all()} == {
        "user:leaving may not run.start in team 'support' (docs/permissions.md)"}
    assert not Run.objects.filter(version=fixed).exists()


def test_a_budget_refusal_is_recorded_for_its_source_and_the_batch_goes_on(versions, requester, team):
    broken, fixed = versions
    sources = failed_runs(broken, 3)
    BudgetLimit.objects.create(team=team, max_concurrent_runs=2)

    rerun = advance_to_end(runs_rerun(run_ids=[r.id for r in sources], version=fixed,
                                      actor=requester, key="k"))

    assert (rerun.started, rerun.refused) == (2, 1)
    refused = rerun.items.get(outcome="refused")
    assert refused.source_run_id == sources[2].id and refused.new_run is None
    assert "unfinished runs" in refused.reason


def test_an_archived_workflow_refuses_every_source_with_the_reason(versions, requester):
    broken, fixed = versions
    sources = failed_runs(broken, 2)
    rerun = runs_rerun(run_ids=[r.id for r in sources], version=fixed, actor=requester, key="k")
    workflow_archive(workflow_id=fixed.workflow_id, actor=SETUP)

    rerun = advance_to_end(rerun)

    assert (rerun.started, rerun.refused) == (0, 2)
    assert all("archived" in item.reason for item in rerun.items.all())


def test_a_run_still_going_or_a_child_run_is_refused_by_itself(versions, requester):
    broken, fixed = versions
    ended = failed_runs(broken, 1)[0]
    going = run_start(version=broken, input={"ticket": "live"}, actor=SETUP)

    rerun = advance_to_end(runs_rerun(run_ids=[going.id, ended.id], version=fixed,
                                      actor=requester, key="k"))

    assert (rerun.started, rerun.refused) == (1, 1)
    assert rerun.items.get(source_run=going).reason.startswith("still running")


def test_sealed_secret_input_is_carried_sealed_to_the_new_run(versions, requester):
    broken, fixed = versions
    token = "tok-5f3c9a1e7d2b4c68"
    source = failed_runs(broken, 1, api_token=token)[0]
    assert source.input["api_token"] == {"secret": "input.api_token"}

    rerun = advance_to_end(runs_rerun(run_ids=[source.id], version=fixed, actor=requester, key="k"))

    new = rerun.items.get().new_run
    assert new.input == {"ticket": "T-0", "api_token": {"secret": "input.api_token"}}
    assert revealed_for(new.id).values == {"input.api_token": token}
    assert token not in RunSecret.objects.get(run=new).sealed
    assert not Event.objects.filter(run=new, payload__icontains=token).exists()


def test_a_secret_only_the_old_version_marked_stays_sealed_on_the_new_one(team, requester):
    """`pin` is writeOnly in v1's schema only: carried to v2, it is still sealed, not stored in
    clear because v2's schema forgot to mark it."""
    marked = echo_definition(fixed=True)
    marked["input_schema"] = {**SCHEMA, "properties": {**SCHEMA["properties"],
                                                       "pin": {"type": "string", "writeOnly": True}}}
    old, _ = workflow_save(team=team, definition=marked, actor=SETUP)
    unmarked = echo_definition(fixed=True)
    unmarked["input_schema"] = {**SCHEMA, "properties": {**SCHEMA["properties"], "pin": {"type": "string"}}}
    new_version, _ = workflow_save(team=team, definition=unmarked, actor=SETUP)
    pin = "pin-5f3c9a1e7d2b4c68"
    source = run_to_end(run_start(version=old, input={"ticket": "T", "pin": pin}, actor=SETUP))

    rerun = advance_to_end(runs_rerun(run_ids=[source.id], version=new_version, actor=requester, key="k"))

    new = rerun.items.get().new_run
    assert new.input["pin"] == {"secret": "input.pin"}
    assert revealed_for(new.id).values == {"input.pin": pin}


def test_a_secret_the_chosen_version_refuses_is_not_quoted_in_the_reason(team, requester):
    """`pin` is secret by the old version's schema (writeOnly) only; the chosen version neither
    marks it nor accepts its length, and its schema's message would quote the value."""
    loose = echo_definition(fixed=True)
    loose["input_schema"] = {**SCHEMA, "properties": {**SCHEMA["properties"],
                                                      "pin": {"type": "string", "writeOnly": True}}}
    loose_version, _ = workflow_save(team=team, definition=loose, actor=SETUP)
    strict = echo_definition(fixed=True)
    strict["input_schema"] = {**SCHEMA, "properties": {**SCHEMA["properties"],
                                                       "pin": {"type": "string", "maxLength": 4}}}
    strict_version, _ = workflow_save(team=team, definition=strict, actor=SETUP)
    pin = "pin-5f3c9a1e7d2b4c68"
    source = run_to_end(run_start(version=loose_version, input={"ticket": "T", "pin": pin}, actor=SETUP))
    assert source.input["pin"] == {"secret": "input.pin"}

    rerun = advance_to_end(runs_rerun(run_ids=[source.id], version=strict_version,
                                      actor=requester, key="k"))

    item = rerun.items.get()
    assert item.outcome == "refused" and "input.pin" in item.reason
    assert pin not in item.reason and pin not in str(item.problems)


def test_a_sealed_input_no_key_opens_is_refused_not_lost(versions, requester, settings):
    broken, fixed = versions
    source = failed_runs(broken, 1, api_token="tok-5f3c9a1e7d2b4c68")[0]
    rerun = runs_rerun(run_ids=[source.id], version=fixed, actor=requester, key="k")
    settings.STEPWISE_TRIGGER_KEY = "another key altogether"

    rerun = advance_to_end(rerun)

    item = rerun.items.get()
    assert item.outcome == "refused" and "sealed under a key" in item.reason
    assert RunSecret.objects.filter(run=source).exists()


def test_a_large_batch_moves_in_chunks(versions, requester, team):
    broken, fixed = versions
    sources = failed_runs(broken, 25)
    rerun = runs_rerun(run_ids=[r.id for r in sources], version=fixed, actor=requester, key="k")

    rerun = rerun_advance(rerun_id=rerun.id)
    assert (rerun.state, rerun.started) == ("running", 20)
    rerun = rerun_advance(rerun_id=rerun.id)
    assert (rerun.state, rerun.started) == ("done", 25)


def test_the_batch_key_is_per_team(versions, requester):
    broken, fixed = versions
    other_team = TeamFactory(slug="elsewhere")
    other_version, _ = workflow_save(team=other_team, definition=echo_definition(fixed=False), actor=SETUP)
    run_to_end(run_start(version=other_version, input={"ticket": "x"}, actor=SETUP))
    failed_runs(broken, 1)

    ours = runs_rerun(filters={"state": ["failed"]}, version=fixed, actor=requester, key="same")
    theirs = runs_rerun(filters={"state": ["failed"]}, version=other_version, actor=SETUP, key="same")

    assert ours.id != theirs.id and theirs._created
