"""validate_definition never raises, whatever shape the document has."""

from __future__ import annotations

import copy
import random

import pytest

from orchestrator.engine.definitions import Problem

ODD_VALUES = [None, True, 0, -1, 1.5, "", "x", "{{", "false", [], [None], ["x"], {}, {"x": 1}, [{}]]


def locations(node, path=()):
    yield path
    if isinstance(node, dict):
        for key, value in node.items():
            yield from locations(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from locations(value, (*path, index))


def replaced(doc, path, value):
    doc = copy.deepcopy(doc)
    node = doc
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return doc


@pytest.mark.parametrize("example", ["support", "routing"])
def test_any_single_value_replaced_by_an_odd_value_never_raises(
    example, support_workflow, routing_workflow, validate
):
    doc = support_workflow if example == "support" else routing_workflow
    for position, path in enumerate(list(locations(doc))[1:]):
        # Three odd values per location, rotating, keeps the sweep to a few seconds.
        for value in (ODD_VALUES * 2)[position % len(ODD_VALUES) :][:3]:
            problems = validate(replaced(doc, path, value))
            assert all(isinstance(p, Problem) for p in problems)


def test_random_multi_edits_never_raise(support_workflow, routing_workflow, validate):
    rng = random.Random(20240611)
    for _ in range(150):
        doc = copy.deepcopy(rng.choice([support_workflow, routing_workflow]))
        for _ in range(rng.randint(2, 6)):
            path = rng.choice(list(locations(doc))[1:])
            doc = replaced(doc, path, copy.deepcopy(rng.choice(ODD_VALUES)))
        validate(doc)
