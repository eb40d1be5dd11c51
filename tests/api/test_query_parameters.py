"""Query parameters the API cannot use are a 400 naming them, never silently ignored.

Found by the API fuzzer (tests/api/test_openapi_fuzz.py): `?offset=null`, `?offset=false` and
`?limit=abc` (under the pagination by offset that cursors replaced) returned the first page as if no value were given, a limit of 10**25 reached the
database and gave a 500, `?run=` (empty) listed every run's approvals, and a parameter given
twice quietly used the last value.
"""
import pytest

from orchestrator.engine.services.workflows import workflow_save
from orchestrator.web.api.pagination import MAX_CURSOR_CHARS, MAX_LIMIT, MAX_OFFSET
from tests.factories import example_definition

from .published import assert_documented, published_schema

pytestmark = pytest.mark.django_db

LISTS = ["/api/v1/workflows/", "/api/v1/runs/", "/api/v1/approvals/", "/api/v1/dead-letters/"]


@pytest.fixture
def workflows(team, requester):
    for name in ("alpha", "beta", "gamma"):
        workflow_save(team=team, definition={**example_definition("support"), "name": name},
                      actor=requester)


def assert_refused(api, url: str, parameter: str) -> str:
    response = api.get(url)
    assert response.status_code == 400, response.content
    [error] = response.json()["errors"]
    assert error["path"] == parameter, error
    return error["message"]


@pytest.mark.parametrize("path", LISTS)
@pytest.mark.parametrize("query", ["offset=null", "offset=false", "offset=-1", "offset=1.5",
                                   "offset=%2B1", "offset=", "offset=%D9%A3",
                                   f"offset={MAX_OFFSET + 1}", "offset=1&offset=2"])
def test_an_offset_that_is_not_one_whole_number_in_range_is_a_400(api, path, query):
    message = assert_refused(api, f"{path}?{query}", "offset")

    assert message.startswith(f"offset must be one whole number from 0 to {MAX_OFFSET}")


@pytest.mark.parametrize("query", ["limit=false", "limit=abc", "limit=0", "limit=-5",
                                   f"limit={MAX_LIMIT + 1}", "limit=44726338066274713050848165888",
                                   "limit=" + "9" * 5000, "limit=5&limit=6"])
def test_a_limit_that_is_not_one_whole_number_in_range_is_a_400(api, query):
    message = assert_refused(api, f"/api/v1/workflows/?{query}", "limit")

    assert message.startswith(f"limit must be one whole number from 1 to {MAX_LIMIT}")


@pytest.mark.parametrize("path", LISTS)
def test_an_offset_past_the_first_page_is_a_400_pointing_at_the_cursor(api, path):
    message = assert_refused(api, f"{path}?offset=2", "offset")

    assert "follow the `next` link" in message and "cursor" in message


def test_a_limit_pages_and_offset_zero_is_the_first_page(api, workflows):
    page = api.get("/api/v1/workflows/?limit=2&offset=0").json()
    rest = api.get(page["next"]).json()

    assert [w["name"] for w in page["results"]] == ["alpha", "beta"]
    assert "offset" not in page["next"] and "cursor=" in page["next"]
    assert [w["name"] for w in rest["results"]] == ["gamma"] and rest["next"] is None
    assert "count" not in page
    assert len(api.get("/api/v1/workflows/").json()["results"]) == 3


def test_the_schema_publishes_the_ranges_and_the_400(api):
    parameters = {p["name"]: p["schema"] for p in
                  published_schema(api)["paths"]["/api/v1/runs/"]["get"]["parameters"]}

    assert parameters["limit"] == {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT,
                                   "default": 50}
    assert parameters["cursor"] == {"type": "string", "maxLength": MAX_CURSOR_CHARS}
    assert "offset" not in parameters
    assert_documented(api, api.get("/api/v1/runs/?cursor=null"), "GET", "/api/v1/runs/")


@pytest.mark.parametrize("url, parameter", [
    ("/api/v1/approvals/?run=", "run"),
    ("/api/v1/dead-letters/?run=", "run"),
    ("/api/v1/dead-letters/?status=", "status"),
    ("/api/v1/runs/?created_before=", "created_before"),
    ("/api/v1/runs/?created_after=", "created_after"),
])
def test_a_typed_filter_given_empty_is_a_400_not_no_filter(api, url, parameter):
    assert "must not be empty" in assert_refused(api, url, parameter)


@pytest.mark.parametrize("url, parameter", [
    ("/api/v1/runs/?team=support&team=other", "team"),
    ("/api/v1/runs/?workflow=a&workflow=b", "workflow"),
    ("/api/v1/dead-letters/?error_class=a&error_class=b", "error_class"),
])
def test_a_single_valued_filter_given_twice_is_a_400(api, url, parameter):
    assert assert_refused(api, url, parameter) == f"give {parameter} once, not 2 times"


def test_text_filters_may_be_empty_and_states_may_repeat(api):
    assert api.get("/api/v1/runs/?team=&workflow=").status_code == 200
    assert api.get("/api/v1/runs/?state=running&state=failed").status_code == 200


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["0141-11-23T03:52:23-16:36", "2026-01-01T00:00:00+23:59",
                                   "0001-01-01T00:00:00+10:00", "9999-12-31T23:59:00-10:00"])
def test_a_time_filter_with_any_iso_offset_is_compared_in_utc(api, value):
    """ISO 8601 allows UTC offsets PostgreSQL refuses (a 500 found by the fuzzer there)."""
    for name in ("created_after", "created_before"):
        response = api.get("/api/v1/runs/", {name: value})
        assert response.status_code == 200, (name, value, response.content[:200])
