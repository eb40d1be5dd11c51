"""How a map step's items become its output: `list`, `dict_merge`, `first_success`, and a map
over no items at all. The merge itself is table-tested; then each strategy goes through the
services a worker and the chord call (`map_item_run`, `map_join`), with a local HTTP sink
refusing the items a case needs to fail."""
import pytest

from orchestrator.engine.services.kinds import map_step
from orchestrator.engine.services.kinds.map_step import merge
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import MapItem
from tests.factories import SETUP
from tests.support.http_sink import HttpSink

pytestmark = pytest.mark.django_db


def items(*results) -> list[MapItem]:
    """MapItems in index order; a result is an output, or ("error", class) for a failed item."""
    made = []
    for index, result in enumerate(results):
        if isinstance(result, tuple):
            made.append(MapItem(index=index, output=None, error={"class": result[1], "message": "x"}))
        else:
            made.append(MapItem(index=index, output=result, error=None))
    return made


FAILED = ("error", "permanent")


@pytest.mark.parametrize("strategy, results, output, error", [
    ("list", [{"a": 1}, 2, "three"], [{"a": 1}, 2, "three"], None),
    ("list", [], [], None),
    ("list", [{"a": 1}, FAILED, FAILED], None,
     {"class": "map_failed", "message": "items [1, 2] failed"}),
    ("dict_merge", [{"a": 1}, {"b": 2}], {"a": 1, "b": 2}, None),
    ("dict_merge", [{"a": 1, "k": "first"}, {"k": "last"}], {"a": 1, "k": "last"}, None),
    ("dict_merge", [], {}, None),
    ("dict_merge", [{"a": 1}, [2]], None,
     {"class": "invalid_output", "message": "item 1 output is not an object; dict_merge needs objects"}),
    ("dict_merge", [{"a": 1}, FAILED], None, {"class": "map_failed", "message": "items [1] failed"}),
    ("first_success", [FAILED, {"n": 1}, {"n": 2}], {"n": 1}, None),
    ("first_success", [{"n": 0}, FAILED], {"n": 0}, None),
    ("first_success", [FAILED, FAILED], None,
     {"class": "map_failed", "message": "no item succeeded (2 failed)"}),
])
def test_merge(strategy, results, output, error):
    merged, problem = merge(strategy, items(*results))
    assert merged == output
    if error is None:
        assert problem is None
    else:
        assert {k: problem[k] for k in ("class", "message")} == error


def test_a_list_merge_names_every_failed_items_error():
    _, problem = merge("list", items({"a": 1}, ("error", "timeout"), ("error", "permanent")))
    assert problem["errors"] == {"1": {"class": "timeout", "message": "x"},
                                 "2": {"class": "permanent", "message": "x"}}


@pytest.fixture
def sink():
    with HttpSink() as sink:
        yield sink


def fan_out(team, sink, *, merge_as: str, over: list):
    version, _ = workflow_save(team=team, definition={
        "name": f"fan-{merge_as}".replace("_", "-"), "input_schema": {"type": "object"},
        "steps": [{"name": "each", "type": "map", "over": "input.items", "merge": merge_as, "item": {
            "type": "tool", "tool": "http.request",
            "params": {"method": "POST", "url": sink.url + "/{{ item }}"}}}]}, actor=SETUP)
    run = run_start(version=version, input={"items": over}, actor=SETUP)
    return run, run.steps.get(name="each")


def run_items(step) -> None:
    for index in MapItem.objects.filter(step=step).values_list("index", flat=True):
        assert map_step.map_item_run(step_id=step.id, index=index).verdict == map_step.DONE
    assert map_step.map_join(step_id=step.id)
    step.refresh_from_db()


def test_first_success_takes_the_first_item_that_succeeded_in_item_order(team, sink):
    sink.refuse("/a", 400)
    run, step = fan_out(team, sink, merge_as="first_success", over=["a", "b", "c"])
    run_items(step)
    assert step.state == "completed"
    assert step.output["status"] == 200 and step.output["body"] == {"ok": True, "duplicate": False}
    assert [r["path"] for r in sink.requests] == ["/a", "/b", "/c"]
    run.refresh_from_db()
    assert run.state == "completed"


def test_first_success_fails_the_step_when_every_item_failed(team, sink):
    sink.refuse("/a", 400)
    sink.refuse("/b", 400)
    run, step = fan_out(team, sink, merge_as="first_success", over=["a", "b"])
    run_items(step)
    assert (step.state, step.error["class"]) == ("failed", "map_failed")
    run.refresh_from_db()
    assert run.state == "failed"


def test_dict_merge_of_items_through_the_join(team, sink):
    run, step = fan_out(team, sink, merge_as="dict_merge", over=["a", "b"])
    run_items(step)
    assert step.state == "completed"
    assert step.output["status"] == 200 and set(step.output) == {"status", "headers", "body"}


@pytest.mark.parametrize("merge_as, empty", [("list", []), ("dict_merge", {}), ("first_success", {})])
def test_a_map_over_no_items_completes_at_once_with_an_empty_output(team, sink, merge_as, empty):
    run, step = fan_out(team, sink, merge_as=merge_as, over=[])
    assert (step.state, step.output) == ("completed", empty)
    assert not MapItem.objects.filter(step=step).exists()
    assert not map_step.map_join(step_id=step.id)  # nothing to join: it never waited
    run.refresh_from_db()
    assert run.state == "completed" and run.output == {"each": empty}
    assert sink.requests == []
