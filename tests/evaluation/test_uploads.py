"""Uploads: JSON lines and CSV read with the standard library, bounded, every bad line reported
by its number (and the path inside it), and nothing kept unless every line is good."""
import json

import pytest

from evaluation.services import dataset_cases_upload
from evaluation.uploads import format_of, parse_cases
from orchestrator.engine.errors import InputInvalid

from .conftest import SAMPLES, good_case

pytestmark = pytest.mark.django_db


def jsonl(*cases) -> bytes:
    return "".join(json.dumps(c) + "\n" for c in cases).encode()


def csv_text(*rows: str) -> bytes:
    return ("key,input,expected,risk_tier,tags\n" + "".join(r + "\n" for r in rows)).encode()


def problems(exc) -> list[tuple[str, str]]:
    return [(p["path"], p["message"]) for p in exc.value.problems]


def test_the_sample_file_uploads_whole(dataset, editor):
    version = dataset_cases_upload(dataset=dataset, data=(SAMPLES / "refund-proposal.jsonl").read_bytes(),
                                   fmt="jsonl", actor=editor)
    assert version.case_count == 30 and version.tier_counts["high"] >= 10


def test_every_bad_line_is_reported_by_number_and_path_and_nothing_is_kept(dataset, editor):
    data = jsonl(good_case("a")) + b"\n" + b"{not json\n" + jsonl(
        good_case("b", input={"order_id": "x", "message": "m"}), [1, 2],
        good_case("c", expected={"steps": {"ghost": {"abstain": True}}}))
    with pytest.raises(InputInvalid) as refused:
        dataset_cases_upload(dataset=dataset, data=data, fmt="jsonl", actor=editor)
    found = problems(refused)
    # What does not parse is reported first, alone: the lines that parse are checked once all do.
    assert [path for path, _ in found] == ["line 3", "line 5"]
    assert found[0][1].startswith("invalid JSON")
    assert dataset.versions.count() == 1


def test_lines_that_parse_are_then_checked_each_at_its_line(dataset, editor):
    data = jsonl(good_case("a"), good_case("b", input={"order_id": "x", "message": "m"}),
                 good_case("c", expected={"steps": {"ghost": {"abstain": True}}}), good_case("a"))
    with pytest.raises(InputInvalid) as refused:
        dataset_cases_upload(dataset=dataset, data=data, fmt="jsonl", actor=editor)
    assert [path for path, _ in problems(refused)] == ["line 2.input.order_id", "line 3.expected.steps.ghost",
                                                       "line 4.key"]
    assert dataset.versions.count() == 1


def test_a_csv_file_with_json_cells_and_comma_separated_tags(dataset, editor):
    expected = json.dumps({"run": {"must_be_approved": True}}).replace('"', '""')
    data = csv_text(f'c1,"{{""order_id"": ""ORD-1001"", ""message"": ""never arrived""}}","{expected}",high,"a, b"',
                    f'c2,"{{""order_id"": ""ORD-1002"", ""message"": ""hi""}}","{expected}",low,')
    version = dataset_cases_upload(dataset=dataset, data=data, fmt="csv", actor=editor)
    assert dict(version.cases.values_list("key", "tags")) == {"c1": ["a", "b"], "c2": []}


def test_csv_problems_name_the_line_and_the_column(dataset, editor):
    good = '"{""order_id"": ""ORD-1001"", ""message"": ""m""}","{""run"": {""state"": ""completed""}}"'
    data = csv_text(f"c1,{good},high,", "c2,{oops},{bad,low,", f"c3,{good}", f"c4,{good},urgent,")
    with pytest.raises(InputInvalid) as refused:
        dataset_cases_upload(dataset=dataset, data=data, fmt="csv", actor=editor)
    assert [path for path, _ in problems(refused)] == ["line 3.input", "line 3.expected", "line 4"]
    data = csv_text(f"c1,{good},high,", f"c4,{good},urgent,")
    with pytest.raises(InputInvalid) as refused:
        dataset_cases_upload(dataset=dataset, data=data, fmt="csv", actor=editor)
    assert [path for path, _ in problems(refused)] == ["line 3.risk_tier"]


def test_a_csv_header_must_name_the_columns():
    with pytest.raises(InputInvalid) as refused:
        parse_cases(b"key,input,risk\nx,{},low\n", "csv")
    assert problems(refused)[0][0] == "line 1" and "missing expected, risk_tier" in problems(refused)[0][1]


def test_a_quoted_cell_over_several_lines_keeps_the_line_it_starts_on():
    data = csv_text('a,"{}","{}",low,', 'b,"{\n}","{oops}",low,', 'c,"{}","{}",low,')
    with pytest.raises(InputInvalid) as refused:
        parse_cases(data, "csv")
    assert [path for path, _ in problems(refused)] == ["line 3.expected"]


@pytest.mark.parametrize("data, message", [
    (b"\xff\xfe{}", "not UTF-8"),
    (b"", "holds no case"),
    (b"\n\n", "holds no case"),
])
def test_a_file_that_is_no_cases_is_refused(data, message):
    with pytest.raises(InputInvalid) as refused:
        parse_cases(data, "jsonl")
    assert message in problems(refused)[0][1]


def test_a_file_over_the_limits_is_refused_before_it_is_read(monkeypatch):
    import evaluation.uploads as uploads

    monkeypatch.setattr(uploads, "MAX_UPLOAD_BYTES", 100)
    with pytest.raises(InputInvalid, match="too large"):
        parse_cases(b"{}\n" * 40, "jsonl")
    monkeypatch.setattr(uploads, "MAX_CASES_PER_CHANGE", 3)
    with pytest.raises(InputInvalid) as refused:
        parse_cases(b"{}\n" * 4, "jsonl")
    assert "at most 3" in problems(refused)[0][1]


@pytest.mark.parametrize("content_type, filename, fmt", [
    ("application/jsonl", "", "jsonl"), ("application/x-ndjson; charset=utf-8", "", "jsonl"),
    ("text/csv", "", "csv"), ("application/octet-stream", "cases.JSONL", "jsonl"),
    ("", "cases.csv", "csv"), ("application/json", "cases.txt", None),
])
def test_the_format_from_the_media_type_or_the_file_name(content_type, filename, fmt):
    assert format_of(content_type, filename) == fmt
