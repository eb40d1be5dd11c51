import pytest

from tests.support.oidc import Provider


@pytest.fixture(scope="session")
def oidc_provider(tmp_path_factory):
    """The test OpenID Connect provider (tests/support/oidc/), running on a free port, with
    Stepwise's test client's callback registered."""
    provider = Provider(tmp_path_factory.mktemp("oidc"))
    provider.start()
    provider.allow_redirect("http://testserver/sso/callback/")
    yield provider
    provider.stop()
