"""The live pages' tests use the real web server and workers of the browser tests."""
from tests.browser.conftest import web_server, workers  # noqa: F401
