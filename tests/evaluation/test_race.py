"""Two processes changing one dataset at once both get their version: the second waits for the
first (the dataset row locked on PostgreSQL; SQLite's IMMEDIATE transactions), reads its version
and writes the next, holding both cases. Runs on whichever backend the session uses."""
import pytest

from evaluation.services import dataset_create
from tests.budgets.test_race import race
from tests.factories import SETUP

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ADDER = """
import json, os, sys, time
import django
django.setup()
from django.db import transaction
from evaluation.models import Dataset
from evaluation.services import dataset_cases_add
from orchestrator.engine.authz import System

key, go = sys.argv[1], sys.argv[2]
dataset = Dataset.objects.select_related("team", "workflow").get(name="raced")
case = {"key": f"k{key}", "risk_tier": "high", "input": {"order_id": "ORD-1001", "message": "m"},
        "expected": {"run": {"state": "completed"}}}
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.001)
with transaction.atomic():
    version = dataset_cases_add(dataset=dataset, cases=[case], actor=System("racer"))
    time.sleep(0.5)  # what it read stays the truth only if nobody else could write meanwhile
print(version.number, flush=True)
"""


def test_two_changes_at_once_become_two_versions(refund, tmp_path):
    dataset = dataset_create(workflow=refund, name="raced", actor=SETUP)

    assert race(ADDER, [1, 2], tmp_path) == ["2", "3"]
    assert sorted(dataset.latest_version.cases.values_list("key", flat=True)) == ["k1", "k2"]
