"""The `format`s of a run's input that are checked are the ones docs/definitions.md lists: each
refuses a value that breaks it and takes one that keeps it; `iri` is an annotation only."""
import re
from pathlib import Path

import pytest

from orchestrator.engine.services.runs import input_problems

DOCS = Path(__file__).resolve().parents[2] / "docs" / "definitions.md"

# format: (a value that keeps it, one that breaks it)
EXAMPLES = {
    "email": ("a@example.com", "not-an-address"),
    "idn-email": ("ä@example.com", "no-at-sign"),
    "date": ("2026-12-06", "2026-13-06"),
    "date-time": ("2026-12-06T10:00:00Z", "yesterday"),
    "time": ("10:00:00Z", "25:00:00Z"),
    "duration": ("P3DT4H", "three days"),
    "hostname": ("api.example.com", "-bad-.example.com"),
    "idn-hostname": ("bücher.example", "-bad-.example"),
    "ipv4": ("192.0.2.1", "192.0.2.300"),
    "ipv6": ("2001:db8::1", "2001:db8::g"),
    "uri": ("https://example.com/a?b=c", "no scheme here"),
    "uri-reference": ("/a/b?c=d", "a b\\c"),
    "uri-template": ("https://example.com/{id}", "https://example.com/{id"),
    "json-pointer": ("/a/0", "a/0"),
    "relative-json-pointer": ("1/a", "/a"),
    "regex": ("^a+$", "(unclosed"),
    "uuid": ("5f0c6d2e-8b1a-4c3e-9d7f-2a6b4e8c1d0f", "5f0c6d2e"),
}


def documented() -> list[str]:
    section = DOCS.read_text().split("### Input formats", 1)[1].split("\n## ", 1)[0]
    checked = section.split("These are checked:", 1)[1].split(".", 1)[0]
    return re.findall(r"`([a-z0-9-]+)`", checked)


def test_the_formats_the_docs_list_are_the_ones_tested_here():
    assert documented() == list(EXAMPLES)


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_each_listed_format_refuses_a_value_that_breaks_it(name):
    kept, broken = EXAMPLES[name]
    schema = {"type": "object", "properties": {"value": {"type": "string", "format": name}}}
    assert input_problems(schema, {"value": kept}) == []
    problems = input_problems(schema, {"value": broken})
    assert [p["path"] for p in problems] == ["input.value"], problems
    assert name in problems[0]["message"]


@pytest.mark.parametrize("name", ["iri", "iri-reference", "not-a-known-format"])
def test_a_format_without_a_checker_is_an_annotation(name):
    schema = {"type": "object", "properties": {"value": {"type": "string", "format": name}}}
    assert input_problems(schema, {"value": "not an identifier of any kind"}) == []
