"""Calling a tool the way a worker does, against named connections a test defines."""
import os
import secrets
import shutil
import subprocess
import sys
import time

import httpx
import pytest
from jsonschema import Draft202012Validator

from orchestrator.engine.retry import StepError
from orchestrator.integrations.tools.registry import ToolContext, get_tool
from tests.support.integrations import REQUIRED, closed_port


def call(name: str, params: dict, *, team: str = "support", key: str | None = None,
         timeout_s: float | None = None, side_effect: bool | None = None):
    """Validate `params` against the tool's schema and call it, as the tool executor does
    (tests/engine covers the executor itself). Raises StepError."""
    tool = get_tool(name)
    errors = list(Draft202012Validator(tool.params_schema).iter_errors(params))
    if errors:
        raise StepError("validation", "; ".join(e.message for e in errors))
    ctx = ToolContext(run_id="r", step_name="step", attempt=1,
                      idempotency_key=key or f"run-{secrets.token_hex(6)}:step:default",
                      side_effect=tool.side_effect if side_effect is None else side_effect,
                      timeout_s=timeout_s,
                      team_lookup=lambda: team)
    return tool.fn(params, ctx)


def fails(error_class: str, name: str, params: dict, **kwargs) -> StepError:
    """The StepError calling the tool raises; the test fails if it is not of `error_class`."""
    with pytest.raises(StepError) as caught:
        call(name, params, **kwargs)
    assert caught.value.error_class == error_class, caught.value
    return caught.value


@pytest.fixture
def connections(settings):
    """Define named connections for this test: `connections(name={...}, ...)`."""
    settings.STEPWISE_CONNECTIONS = {}

    def define(**named):
        settings.STEPWISE_CONNECTIONS = {**settings.STEPWISE_CONNECTIONS, **named}
        return settings.STEPWISE_CONNECTIONS

    return define


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server as a separate process on a free loopback port."""
    if shutil.which("moto_server", path=os.path.dirname(sys.executable)) is None:
        reason = "moto_server is not installed (pip install 'moto[server]')"
        if REQUIRED:
            pytest.fail(reason)
        pytest.skip(reason)
    port = closed_port()
    proc = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "moto_server"),
                             "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(timeout=10)
