"""An evaluation may send a workflow's side-effecting calls to a sandbox connection the operator
names (a test account of the same kind) instead of answering them: the calls are made, there,
and never through the live connection."""
import pytest

from evaluation.evaluations import evaluation_start
from evaluation.services import dataset_cases_add, dataset_create
from orchestrator.engine.errors import InputInvalid
from orchestrator.engine.services.workflows import workflow_save
from tests.factories import SETUP

from .test_evaluations import drive, paths

pytestmark = pytest.mark.django_db

ARCHIVE = {"name": "archive", "input_schema": {"type": "object", "required": ["n"],
                                               "properties": {"n": {"type": "integer"}}},
           "steps": [{"name": "write", "type": "tool", "tool": "files.write",
                      "params": {"connection": "docs", "path": "note-{{ input.n }}.txt",
                                 "content": "case {{ input.n }}"}}]}


@pytest.fixture
def roots(settings, tmp_path):
    live, test = tmp_path / "live", tmp_path / "test"
    live.mkdir(), test.mkdir()
    settings.STEPWISE_CONNECTIONS = {
        "docs": {"kind": "files", "root": str(live), "writes": True},
        "docs_test": {"kind": "files", "root": str(test), "writes": True},
        "elsewhere": {"kind": "files", "root": str(test), "writes": True, "teams": ["other"]},
        "warehouse": {"kind": "sql", "url": "sqlite:///:memory:"},
    }
    return live, test


@pytest.fixture
def archive(team, roots, editor):
    version, _ = workflow_save(team=team, definition=ARCHIVE, actor=SETUP)
    dataset = dataset_create(workflow=version.workflow, name="notes", actor=editor)
    dataset_cases_add(dataset=dataset, actor=editor, cases=[
        {"key": f"n{n}", "input": {"n": n}, "expected": {"run": {"state": "completed"}}, "risk_tier": "low"}
        for n in (1, 2)])
    return dataset


def test_the_calls_go_to_the_sandbox_connection_and_never_to_the_live_one(archive, roots, editor):
    live, test = roots
    done = drive(evaluation_start(dataset=archive, version=1, actor=editor, budget_usd=1,
                                  sandbox_connections={"docs": "docs_test"}))
    assert done.state == "completed" and done.cases.filter(passed=True).count() == 2
    assert sorted(p.name for p in test.glob("note-*")) == ["note-1.txt", "note-2.txt"]
    assert (test / "note-1.txt").read_text() == "case 1"
    assert list(live.iterdir()) == []
    [effect] = done.cases.get(key="n1").outcome["effects"]
    assert effect["params"]["connection"] == "docs_test"


def test_without_a_sandbox_connection_the_calls_are_answered_and_reach_nothing(archive, roots, editor):
    live, test = roots
    done = drive(evaluation_start(dataset=archive, version=1, actor=editor, budget_usd=1))
    assert done.state == "completed"
    assert list(live.iterdir()) == [] and list(test.iterdir()) == []


def test_a_sandbox_connection_must_exist_be_of_the_same_kind_and_be_the_teams(archive, editor):
    for connections, message in (({"nowhere": "docs_test"}, "no connection named 'nowhere'"),
                                 ({"docs": "warehouse"}, "not files"),
                                 ({"docs": "docs"}, "another connection"),
                                 ({"docs": "elsewhere"}, "not granted"),
                                 ({"docs": "gone"}, "no connection named 'gone'")):
        with pytest.raises(InputInvalid) as refused:
            evaluation_start(dataset=archive, version=1, actor=editor, budget_usd=1,
                             sandbox_connections=connections)
        assert paths(refused) == [f"sandbox_connections.{next(iter(connections))}"]
        assert message in refused.value.problems[0]["message"], refused.value.problems


def test_a_run_sandbox_names_connections_as_an_object_of_other_names(archive):
    from orchestrator.engine.services.runs import run_start

    version = archive.workflow.active_version
    for connections in ({"docs": "docs"}, ["docs_test"], {"docs": ""}):
        with pytest.raises(InputInvalid) as refused:
            run_start(version=version, input={"n": 1}, actor=SETUP, capacity="evaluation",
                      sandbox={"connections": connections})
        assert paths(refused) == ["sandbox.connections"]


def test_a_sandboxed_run_of_an_archived_workflow_does_not_start(archive):
    from orchestrator.engine.errors import NotAllowed
    from orchestrator.engine.services.runs import run_start
    from orchestrator.engine.services.workflows import workflow_archive

    workflow_archive(workflow_id=archive.workflow_id, actor=SETUP)
    archive.workflow.refresh_from_db()
    with pytest.raises(NotAllowed):
        run_start(version=archive.workflow.active_version, input={"n": 1}, actor=SETUP, capacity="evaluation",
                  sandbox={"purpose": "evaluation"})
