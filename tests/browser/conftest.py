"""Browser tests: headless Chromium driven by Playwright, against a real server process.

Fixtures any browser test may use (the approvals inbox, the live run pages, ...):

* `browser` (session) — Chromium launched headless through Playwright's sync API. Playwright
  comes from PyPI; the browser is the system's (Debian's `chromium`, at /usr/bin/chromium, or the
  path in STEPWISE_CHROMIUM), because the build Playwright downloads is not available here.
  When Playwright or the browser is missing, the test is **skipped** with the reason; with
  `STEPWISE_REQUIRE_BROWSER=1` (CI sets it) it **fails** instead, so CI never passes by skipping.
  Django refuses ORM calls from a thread with a running event loop, which Playwright's sync API
  keeps while the browser is open; the fixture sets DJANGO_ALLOW_ASYNC_UNSAFE for as long (the
  tests' ORM calls and the browser's are sequential, never concurrent).
* `browser_page` — a fresh page in a context of its own (its own cookies), 1440x900, closed
  after the test.
* `web_server` (session) — a real ASGI server (uvicorn, as `make run`'s web process) on a free
  port, serving the test database; the value is its base URL. Static files are collected first
  (once per test process, for this server and any `fresh_web_server`).
  Steps are run by the real Celery workers of the `workers` fixture
  (tests/integration/conftest.py, re-exported here with `wait_for_run`).
* `screenshot(page, name)` — saves a full-page PNG under STEPWISE_SCREENSHOT_DIR when it is set
  (the docs' screenshots are taken this way), and does nothing otherwise.

Browser tests use the transactional database (`django_db(transaction=True)`), so the server and
the workers see what the test writes, and are marked `browser` and `integration`.
"""
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

from tests.integration.conftest import ROOT, wait_for, wait_for_run, worker_env  # noqa: F401

CHROMIUM = os.environ.get("STEPWISE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update"]


def _unavailable(reason: str):
    if os.environ.get("STEPWISE_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{reason}; STEPWISE_REQUIRE_BROWSER=1 requires the browser tests to run")
    pytest.skip(reason)


def expect(locator):
    """Playwright's retrying assertions: a count or a text read right after a click may read the
    page the click is leaving."""
    from playwright.sync_api import expect as playwright_expect
    return playwright_expect(locator)


@pytest.fixture(scope="session")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("Playwright is not installed (pip install -e '.[dev]')")
    if not Path(CHROMIUM).exists():
        _unavailable(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set STEPWISE_CHROMIUM)")
    before = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                                  args=CHROMIUM_ARGS)
            yield launched
            launched.close()
    finally:
        if before is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = before


@pytest.fixture
def browser_page(browser):
    context = browser.new_context(viewport={"width": 1440, "height": 900}, locale="en-US",
                                  color_scheme="light")
    page = context.new_page()
    page.set_default_timeout(30_000)
    # What the Content-Security-Policy refused (Chromium reports each on the console): a page
    # that needs an inline script or another host to work fails its test.
    refused = []
    page.on("console", lambda message: refused.append(message.text)
            if "Content Security Policy" in message.text else None)
    # Playwright polls a bare expression with the page's eval, which the policy refuses; a
    # function it compiles once, outside the policy.
    wait_for_function = page.wait_for_function
    page.wait_for_function = lambda expression, **options: wait_for_function(
        expression if expression.lstrip().startswith(("(", "function", "async")) else
        f"() => ({expression})", **options)
    yield page
    context.close()
    assert refused == [], refused


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


_static_collected: list[bool] = []  # once per test process: the files do not change meanwhile


def _collect_static(env: dict) -> None:
    if not _static_collected:
        subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"],
                       cwd=ROOT, env=env, check=True)
        _static_collected.append(True)


class Server:
    """A uvicorn process serving the ASGI app, as `make run` does, on a port of its own that it
    keeps when started again."""

    def __init__(self, name: str):
        self.name, self.port, self.proc = name, _free_port(), None
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**worker_env(), "STEPWISE_REAP_INTERVAL_S": "3600", "PORT": str(self.port)}
        _collect_static(self.env)

    def start(self) -> None:
        log = Path(settings.VAR_DIR) / (
            f"itest-{self.name}-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.log")
        self.proc = proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "orchestrator.asgi:application", "--host",
             "127.0.0.1", "--port", str(self.port), "--log-level", "warning"],
            cwd=ROOT, env=self.env, stdout=log.open("a"), stderr=subprocess.STDOUT,
            start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the web server exited: {log.read_text()[-3000:]}")
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"the web server did not listen: {log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="session")
def web_server(django_db_setup, django_db_blocker):
    from tests.conftest import stopped_when_not_asked_for

    server = Server("web")
    server.start()
    stopped_when_not_asked_for("web_server", server)
    yield server.url
    server.stop()


@pytest.fixture
def fresh_web_server(django_db_setup):
    """A web process of this test's own: it reads content types after the flush before this
    test (the session's server keeps the ids of the first test it served, and an admin save
    writes a log entry naming them)."""
    server = Server("fresh-web")
    server.start()
    yield server.url
    server.stop()


@pytest.fixture
def screenshot():
    folder = os.environ.get("STEPWISE_SCREENSHOT_DIR")

    def take(page, name: str) -> None:
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)

    return take
