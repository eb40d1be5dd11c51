"""Every list pages by keyset: `next`/`previous` links with an opaque cursor, newest first, no
count of the filtered set, a cursor that is not one the list gave is a 400 naming `cursor`."""
import base64
import json
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Run, RunState
from tests.factories import example_definition

from .driving import SUPPORT_INPUT

pytestmark = pytest.mark.django_db

LISTS = ["/api/v1/workflows/", "/api/v1/runs/", "/api/v1/approvals/", "/api/v1/input-tasks/",
         "/api/v1/dead-letters/", "/api/v1/triggers/", "/api/v1/event-dead-letters/",
         "/api/v1/gate-policies/", "/api/v1/datasets/", "/api/v1/evaluations/",
         "/api/v1/reruns/", "/api/v1/tools/"]


@pytest.fixture
def runs(team, requester) -> list[Run]:
    """Seven runs, newest first; three of them started in the same microsecond."""
    version, _ = workflow_save(team=team, definition=example_definition("support"),
                               actor=requester)
    started = [run_start(version=version, input=SUPPORT_INPUT, actor=requester)
               for _ in range(7)]
    base = timezone.now() - timedelta(hours=1)
    for n, run in enumerate(started):
        Run.objects.filter(pk=run.pk).update(
            created_at=base + timedelta(seconds=min(n, 3)))  # runs 3..6 share one time
    return sorted(Run.objects.filter(pk__in=[r.pk for r in started]),
                  key=lambda r: (r.created_at, r.pk), reverse=True)


def walk(api, url: str, link: str) -> list[list[str]]:
    pages = []
    while url:
        body = api.get(url).json()
        pages.append([r["id"] for r in body["results"]])
        url = body[link]
    return pages


def test_runs_page_newest_first_through_ties_forwards_and_back(api, runs):
    forward = walk(api, "/api/v1/runs/?limit=3", "next")

    assert forward == [[str(r.pk) for r in runs[i:i + 3]] for i in (0, 3, 6)]
    last = api.get("/api/v1/runs/?limit=3").json()
    while last["next"]:
        last = api.get(last["next"]).json()
    back = walk(api, last["previous"], "previous")
    assert back == [[str(r.pk) for r in runs[3:6]], [str(r.pk) for r in runs[0:3]]]
    assert api.get(last["previous"]).json()["next"] is not None


def test_a_page_keeps_its_filters_and_counts_nothing(api, runs):
    Run.objects.filter(pk__in=[r.pk for r in runs[1::2]]).update(state=RunState.CANCELLED)

    with CaptureQueriesContext(connection) as queries:
        first = api.get("/api/v1/runs/?state=cancelled&limit=2").json()
    rest = api.get(first["next"]).json()

    assert "state=cancelled" in first["next"] and "count" not in first
    assert [r["id"] for r in first["results"] + rest["results"]] == [str(r.pk) for r in runs[1::2]]
    assert rest["next"] is None and first["previous"] is None
    assert not [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]


def test_a_page_past_the_end_links_back(api, runs):
    last = api.get("/api/v1/runs/?limit=7").json()
    cursor = {"d": "n", "k": [runs[-1].created_at.isoformat(), str(runs[-1].pk)]}
    beyond = api.get(f"/api/v1/runs/?limit=7&cursor={encode(cursor)}").json()

    assert last["next"] is None and beyond["results"] == [] and beyond["next"] is None
    assert [r["id"] for r in api.get(beyond["previous"]).json()["results"]] == [
        str(r.pk) for r in runs]


def encode(payload) -> str:
    return base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")


BAD_CURSORS = [
    "null", "%%%", "a" * 1001, encode([1, 2]), encode({"d": "x", "k": []}),
    encode({"d": "n", "k": ["2026-01-01T00:00:00+00:00"]}),
    encode({"d": "n", "k": ["not a time", "00000000-0000-0000-0000-000000000000"]}),
    encode({"d": "n", "k": ["2026-01-01T00:00:00+00:00", "not a uuid"]}),
    encode({"d": "n", "k": [None, None]}), encode({"d": "n", "k": [{"a": 1}, []]}),
]


@pytest.mark.parametrize("cursor", BAD_CURSORS)
def test_a_cursor_the_list_did_not_give_is_a_400_naming_it(api, cursor):
    response = api.get(f"/api/v1/runs/?cursor={cursor}")

    assert response.status_code == 400, response.content
    [error] = response.json()["errors"]
    assert error["path"] == "cursor" and "next" in error["message"]


@pytest.mark.parametrize("path", LISTS)
def test_every_list_answers_with_links_and_refuses_a_foreign_cursor(api, runs, path):
    body = api.get(f"{path}?limit=1").json()
    refused = api.get(f"{path}?cursor={encode({'d': 'n', 'k': [1, 2, 3, 4, 5, 6]})}")

    assert set(body) == {"next", "previous", "results"}
    assert refused.status_code == 400 and refused.json()["errors"][0]["path"] == "cursor"
    assert api.get(f"{path}?cursor=x&cursor=y").status_code == 400
