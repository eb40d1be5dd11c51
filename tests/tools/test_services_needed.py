"""A test that needs a server skips, saying why, when the server is down here — and fails
instead under STEPWISE_REQUIRE_SERVICES=1, as in CI."""
import socket

import pytest

from tests.support import integrations
from tests.support.integrations import closed_port


@pytest.fixture
def down(monkeypatch):
    port = closed_port()
    monkeypatch.setitem(integrations.PROBES, "Nothing",
                        lambda: socket.create_connection(("127.0.0.1", port), timeout=1).close())


def test_a_service_that_is_down_skips_the_test_with_the_reason(down, monkeypatch):
    monkeypatch.setattr(integrations, "REQUIRED", False)
    with pytest.raises(pytest.skip.Exception, match="Nothing is not reachable on this machine"):
        integrations.need("Nothing")


def test_a_service_that_is_down_fails_the_test_when_services_are_required(down, monkeypatch):
    monkeypatch.setattr(integrations, "REQUIRED", True)
    with pytest.raises(pytest.fail.Exception, match="STEPWISE_REQUIRE_SERVICES=1 but Nothing"):
        integrations.need("Nothing")
