"""Every error under /api/ comes in one shape, `{"errors": [{"path", "message"}]}`: DRF's own
(401, 404, 405, 415, unparsable bodies, bad query parameters) and Django's (a URL no route
matches, an unhandled error) as well as the services'. Found by the API fuzzer
(tests/api/test_openapi_fuzz.py), which checks responses against the published schema."""
import pytest
from rest_framework.test import APIClient

from tests.factories import SETUP

pytestmark = pytest.mark.django_db


def assert_errors(response, status: int, path: str = "") -> list[dict]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json", response["Content-Type"]
    errors = response.json()["errors"]
    assert set(response.json()) == {"errors"}
    assert all(set(e) == {"path", "message"} and e["message"] for e in errors), errors
    assert path in {e["path"] for e in errors}, errors
    return errors


def test_no_token_is_a_401_in_the_error_shape_with_its_challenge():
    response = APIClient().get("/api/v1/runs/")

    [error] = assert_errors(response, 401)
    assert "credentials were not provided" in error["message"]
    assert "'Authorization: Bearer <key>'" in error["message"]  # and how to send them
    assert response["WWW-Authenticate"] == 'Bearer realm="api", Token realm="api"'


@pytest.mark.parametrize("scheme", ["Bearer", "Token", "bearer"])
def test_the_token_is_accepted_as_bearer_or_token(scheme, requester):
    from rest_framework.authtoken.models import Token
    key = Token.objects.create(user=requester).key
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"{scheme} {key}")

    assert client.get("/api/v1/runs/").status_code == 200


@pytest.mark.parametrize("header, says", [
    ("{key}", "has a key but no scheme"),
    ("Basic {key}", "The Authorization scheme 'Basic' is not accepted"),
    ("Bearer {key} extra", "must be a scheme and one key"),
])
def test_a_token_sent_another_way_is_a_401_that_names_the_schemes(header, says, requester):
    from rest_framework.authtoken.models import Token
    key = Token.objects.create(user=requester).key
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header.format(key=key))

    response = client.get("/api/v1/runs/")

    [error] = assert_errors(response, 401)
    assert says in error["message"] and "'Authorization: Bearer <key>'" in error["message"]
    assert response["WWW-Authenticate"] == 'Bearer realm="api", Token realm="api"'


def test_a_wrong_token_is_a_401_in_the_error_shape():
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-token")

    assert_errors(client.get("/api/v1/runs/"), 401)


def test_an_unknown_object_is_a_404_in_the_error_shape(api):
    [error] = assert_errors(api.get("/api/v1/runs/9b0f2b47-0000-4000-8000-000000000000/"), 404)
    assert error["message"] == "No Run matches the given query."


def test_a_url_no_route_matches_is_a_json_404_under_the_api(api):
    """A workflow name the route's pattern refuses never reaches a view: Django answers."""
    assert_errors(api.get("/api/v1/workflows/%C2%84/"), 404)
    assert_errors(api.get("/api/v1/no-such-thing/"), 404)


def test_outside_the_api_a_404_is_still_a_page(client):
    response = client.get("/no-such-page/")

    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


def test_a_method_the_endpoint_does_not_take_is_a_405_with_allow(api):
    response = api.delete("/api/v1/runs/")

    assert_errors(response, 405)
    assert response["Allow"] == "GET, HEAD, OPTIONS"


def test_a_body_that_is_not_json_is_a_400_in_the_error_shape(api, team, requester):
    from orchestrator.engine.services.workflows import workflow_save
    from tests.factories import example_definition

    workflow_save(team=team, definition=example_definition("support"), actor=SETUP)
    response = api.post("/api/v1/workflows/support-reply/runs/", b"\x00",
                        content_type="application/json")

    [error] = assert_errors(response, 400)
    assert "JSON" in error["message"]


def test_a_media_type_the_endpoint_does_not_read_is_a_415(api):
    response = api.post("/api/v1/workflows/", b"name,steps", content_type="text/csv")

    [error] = assert_errors(response, 415)
    assert 'Unsupported media type "text/csv"' in error["message"]


@pytest.mark.parametrize("query, path", [
    ("state=null", "state"), ("created_before=yesterday", "created_before"),
])
def test_a_filter_value_that_is_not_valid_is_a_400_naming_the_parameter(api, query, path):
    [error] = assert_errors(api.get(f"/api/v1/runs/?{query}"), 400, path)
    assert error["path"] == path


def test_a_run_filter_that_is_not_a_uuid_is_a_400_naming_it(api):
    assert_errors(api.get("/api/v1/dead-letters/?run=nope"), 400, "run")


def test_an_unhandled_error_under_the_api_is_a_json_500_that_tells_nothing(rf):
    """Django's handler500 runs outside every view; under /api/ it answers JSON too."""
    from orchestrator.web.api.errors import server_error

    response = server_error(rf.get("/api/v1/runs/"))

    assert response.status_code == 500
    assert response["Content-Type"] == "application/json"
    assert response.content == b'{"errors": [{"path": "", "message": "internal server error"}]}'
    assert server_error(rf.get("/admin/"))["Content-Type"].startswith("text/html")
