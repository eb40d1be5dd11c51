"""A compiled read gives what its queryset gives: the same rows, fields, deferred fields and
joined instances, the same lock, and the same error outside a transaction."""
import pytest
from django.db import connection, transaction
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext

from orchestrator import selectors
from orchestrator.compiled import CompiledRead
from orchestrator.models import Run, StepRun
from orchestrator.services.runs import run_start
from orchestrator.services.workflows import workflow_save
from tests.factories import SETUP

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def run(team):
    version, _ = workflow_save(team=team, definition={
        "name": "compiled", "input_schema": {"type": "object"}, "steps": [
            {"name": "a", "type": "tool", "tool": "core.echo", "params": {"text": "{{ input.word }}"}},
            {"name": "b", "type": "tool", "tool": "core.echo", "after": ["a"]},
            {"name": "c", "type": "tool", "tool": "core.echo", "after": ["a"]}]}, actor=SETUP)
    return run_start(version=version, input={"word": "hello"}, actor=SETUP)


def fields_of(obj) -> dict:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields
            if f.attname not in obj.get_deferred_fields()}


def test_the_locked_run_of_a_step_is_the_querysets_with_the_same_joined_instances(run):
    step = run.steps.get(name="b")
    with transaction.atomic():
        expected = selectors._locked_runs().get(steps__id=step.id)
        found = selectors._locked_run_of_step(step.id)
    assert fields_of(found) == fields_of(expected)
    assert found.get_deferred_fields() == expected.get_deferred_fields()
    for joined in ("version", "team"):
        assert Run._meta.get_field(joined).is_cached(found)
        assert fields_of(getattr(found, joined)) == fields_of(getattr(expected, joined))
    assert found.version.get_deferred_fields() == {"definition", "normalized"}
    assert fields_of(found.version.workflow) == fields_of(expected.version.workflow)
    with CaptureQueriesContext(connection) as queries:
        assert found.team.slug and found.version.workflow.name and found.version.digest
    assert not queries, "a joined instance was read again"


def test_a_runs_steps_come_in_the_querysets_order_with_their_values_and_without_input(run):
    expected = list(StepRun.objects.defer("input").filter(run_id=run.id))
    found = selectors.steps_of(run)
    assert [s.id for s in found] == [s.id for s in expected]
    assert [fields_of(s) for s in found] == [fields_of(s) for s in expected]
    assert all(s.get_deferred_fields() == {"input"} for s in found)
    assert all(s.run is run for s in found)
    ready = next(s for s in found if s.name == "a")
    assert ready.input == {"input": {"word": "hello"}, "steps": {}}  # loaded when read


def test_a_locked_read_takes_the_same_row_lock_as_its_queryset(run):
    with transaction.atomic():
        with CaptureQueriesContext(connection) as queries:
            selectors.lock_run(run.id)
        expected = str(selectors._locked_runs().filter(id=run.id).query)
    lock_clause = expected[expected.index(" FROM "):].split("WHERE")[0]
    assert lock_clause in queries[-1]["sql"]
    if connection.features.has_select_for_update:
        assert "FOR NO KEY UPDATE OF" in queries[-1]["sql"]


def test_a_locked_read_outside_a_transaction_raises_as_the_queryset_does(run):
    with transaction.atomic():
        selectors.lock_run(run.id)  # compiled on this connection
    if not connection.features.has_select_for_update:
        pytest.skip("SQLite has no row locks: the queryset does not raise either")
    with pytest.raises(TransactionManagementError):
        selectors.lock_run(run.id)


def test_what_is_not_there_raises_does_not_exist(run):
    with transaction.atomic():
        with pytest.raises(Run.DoesNotExist):
            selectors.lock_run("00000000-0000-0000-0000-000000000001")
        with pytest.raises(Run.DoesNotExist):
            selectors.lock_run_of_step(10**9)


def test_a_read_given_the_wrong_number_of_values_says_so(run):
    read = CompiledRead(lambda name: StepRun.objects.filter(name=name), "")
    assert [s.name for s in read.rows("a")] == ["a"]
    with pytest.raises(TypeError, match="takes 1 values, 2 given"):
        read.rows("a", "b")


def test_a_read_with_annotations_is_refused(run):
    from django.db.models import F

    read = CompiledRead(lambda name: StepRun.objects.annotate(twice=F("position")).filter(name=name), "")
    with pytest.raises(ValueError, match="model columns only"):
        read.rows("a")
