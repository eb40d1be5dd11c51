"""The Python client puts every name and id it is given into one path segment of its own: a
workflow called `../approvals/7/approve` must not reach the approvals endpoint."""
from urllib.parse import unquote

import httpx
import pytest

from stepwise_client import Stepwise
from stepwise_client.client import Approval

HOSTILE = ["../approvals/7/approve", "..", ".", "a/b", "a?b=c", "a#b", "%2e%2e", "a b"]
ANSWER = {"id": "r", "state": "pending", "run": "r", "step": "s", "status": "started",
          "name": "n", "key": "k"}


@pytest.fixture
def client_and_requests():
    """A client whose requests are recorded and answered 200."""
    requests = []

    def answer(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(200, json=ANSWER)

    http = httpx.Client(base_url="http://stepwise.test", transport=httpx.MockTransport(answer))
    return Stepwise("http://stepwise.test", "t", http=http), requests


@pytest.mark.parametrize("name", HOSTILE)
def test_every_name_and_id_stays_in_its_own_path_segment(client_and_requests, name):
    client, requests = client_and_requests
    client.start(name, {})
    client.get(name)
    client.cancel(name)
    client.fire(name, {})
    client.approve(Approval(id=name, state="pending", run="r", step="s"))
    client.signal(name, name, {})
    expected = [["workflows", name, "runs"], ["runs", name], ["runs", name, "cancel"],
                ["triggers", name, "fire"], ["approvals", name, "approve"],
                ["runs", name, "signals", name]]
    for request, segments in zip(requests, expected, strict=True):
        assert not request.url.query and not request.url.fragment, request.url
        raw = request.url.raw_path.decode()
        assert raw.startswith("/api/v1/") and raw.endswith("/"), raw
        sent = raw.removeprefix("/api/v1/").removesuffix("/").split("/")
        assert [unquote(part) for part in sent] == segments, raw
        assert "." not in sent and ".." not in sent  # no dot segment a server would resolve


@pytest.mark.parametrize("name", HOSTILE)
def test_a_datasets_id_stays_in_its_own_path_segment(client_and_requests, name):
    client, requests = client_and_requests
    client.dataset(name)
    client.add_cases(name, [])
    client.upload_cases(name, b"", format="jsonl")
    client.add_run(name, "r", risk_tier="low")
    client.remove_cases(name, [])
    client.cases(name, version=name)
    expected = [["datasets", name], ["datasets", name, "cases"], ["datasets", name, "upload"],
                ["datasets", name, "from-run"], ["datasets", name, "cases", "remove"],
                ["datasets", name, "versions", name, "cases"]]
    for request, segments in zip(requests, expected, strict=True):
        raw = request.url.raw_path.decode().split("?")[0]
        sent = raw.removeprefix("/api/v1/").removesuffix("/").split("/")
        assert [unquote(part) for part in sent] == segments, raw
        assert "." not in sent and ".." not in sent
