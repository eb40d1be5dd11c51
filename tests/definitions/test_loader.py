"""parse_definition_text: YAML and JSON text to the same plain dict, or DefinitionInvalid."""

from __future__ import annotations

import json

import pytest

from orchestrator.engine.definitions import DefinitionInvalid, parse_definition_text

from .examples import SUPPORT_WORKFLOW_YAML


def test_yaml_and_json_texts_parse_to_the_same_dict():
    from_yaml = parse_definition_text(SUPPORT_WORKFLOW_YAML)
    as_json = json.dumps(from_yaml)

    assert parse_definition_text(as_json) == from_yaml
    assert (
        parse_definition_text(as_json, content_type="application/json; charset=utf-8") == from_yaml
    )
    assert (
        parse_definition_text(json.dumps(from_yaml, indent=2), content_type="application/yaml")
        == from_yaml
    )


def test_dates_stay_strings_so_yaml_matches_json():
    doc = parse_definition_text("name: x\ndescription: 2024-01-02\n")
    assert doc["description"] == "2024-01-02"


@pytest.mark.parametrize(
    ("text", "content_type", "message"),
    [
        ("name: [unclosed", None, "invalid YAML"),
        ("steps:\n  - a\n - b\n", None, "invalid YAML"),
        ("{'name': 1,}", "application/json", "invalid JSON"),
        ("", None, "not empty"),
        ("- a\n- b\n", None, "not a list"),
        ("just a string", None, "not a str"),
        ("42", "application/json", "not a int"),
        ("name: a\nname: b\n", None, "duplicate key 'name'"),
        ('{"name": "a", "name": "b"}', "application/json", "duplicate key 'name'"),
        (b"\xff\xfe", None, "not UTF-8"),
    ],
)
def test_unparsable_text_raises_definition_invalid_at_the_root(text, content_type, message):
    with pytest.raises(DefinitionInvalid) as caught:
        parse_definition_text(text, content_type=content_type)

    [problem] = caught.value.problems
    assert problem.path == ""
    assert (
        message.replace("not empty", "not empty") in problem.message or message in problem.message
    )


def test_safe_loading_refuses_python_objects():
    with pytest.raises(DefinitionInvalid, match="invalid YAML"):
        parse_definition_text("name: !!python/object/apply:os.system ['true']\n")


def test_definition_invalid_message_lists_its_problems():
    with pytest.raises(DefinitionInvalid, match=r"<root>: invalid YAML"):
        parse_definition_text("a: [")


@pytest.mark.parametrize("depth", [65, 1_000, 20_000])
def test_deep_flow_nesting_is_refused_before_the_python_scanner_reads_it(monkeypatch, depth):
    """For each unclosed `[` PyYAML's pure-Python scanner looks up to 1,024 characters ahead:
    deep flow text is refused from libyaml's events before that scanner sees a token."""
    import yaml.scanner

    fetched = []
    fetch = yaml.scanner.Scanner.fetch_more_tokens
    monkeypatch.setattr(yaml.scanner.Scanner, "fetch_more_tokens",
                        lambda self: fetched.append(1) or fetch(self))
    parse_definition_text("name: shallow\nsteps: [[1]]\n")
    assert fetched  # the spy sees the Python scanner at work

    fetched.clear()
    with pytest.raises(DefinitionInvalid, match="nesting|depth"):
        parse_definition_text("name: deep\nsteps: " + "[" * depth + "]" * depth + "\n")
    assert fetched == []
