"""A real OpenID Connect provider for the single sign-on tests: django-oauth-toolkit in a Django
process of its own (settings.py, urls.py here), with an RSA signing key, a login page, a
consent page and a `groups` claim (validators.py). `Provider` starts it on a free port with its
own SQLite database and seeds its people and its one client (seed.py)."""
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

ROOT = Path(__file__).resolve().parents[3]
CLIENT_ID = "stepwise"
CLIENT_SECRET = "stepwise-client-secret-for-tests"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Provider:
    def __init__(self, folder: Path):
        self.folder = folder
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_"))},
            "DJANGO_SETTINGS_MODULE": "tests.support.oidc.settings",
            "OIDC_PROVIDER_DB": str(folder / "provider.sqlite3"),
            "OIDC_PROVIDER_RSA_KEY": key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption()).decode(),
        }
        self.redirect_uris: list[str] = []
        self.proc = None

    def _django(self, *args: str, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "django", *args], cwd=ROOT, env=self.env,
                              check=True, capture_output=True, text=True, **kwargs)

    def start(self) -> None:
        self._django("migrate", "--noinput", "-v0")
        log = self.folder / "provider.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "django", "runserver", "--noreload", f"127.0.0.1:{self.port}"],
            cwd=ROOT, env=self.env, stdout=log.open("a"), stderr=subprocess.STDOUT,
            start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the OIDC provider exited: {log.read_text()[-3000:]}")
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"the OIDC provider did not listen: {log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def allow_redirect(self, uri: str) -> None:
        """Register Stepwise's callback `uri` for the client (seeding the client first)."""
        self.redirect_uris.append(uri)
        self._seed({"client": {"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET,
                               "redirect_uris": self.redirect_uris}})

    def person(self, username: str, password: str, *, groups: list[str],
               email: str = "") -> None:
        """Create or update a person at the provider, in exactly `groups`."""
        self._seed({"person": {"username": username, "password": password, "groups": groups,
                               "email": email or f"{username}@example.com"}})

    def _seed(self, what: dict) -> None:
        self._django("shell", "-c", "from tests.support.oidc.seed import seed; seed()",
                     input=json.dumps(what))

    def settings(self) -> dict:
        """Stepwise's settings for signing in through this provider."""
        return {
            "STEPWISE_OIDC_ENABLED": True,
            "STEPWISE_OIDC_ISSUER": f"{self.url}/o",
            "OIDC_RP_CLIENT_ID": CLIENT_ID,
            "OIDC_RP_CLIENT_SECRET": CLIENT_SECRET,
            "OIDC_OP_AUTHORIZATION_ENDPOINT": f"{self.url}/o/authorize/",
            "OIDC_OP_TOKEN_ENDPOINT": f"{self.url}/o/token/",
            "OIDC_OP_USER_ENDPOINT": f"{self.url}/o/userinfo/",
            "OIDC_OP_JWKS_ENDPOINT": f"{self.url}/o/.well-known/jwks.json",
        }

    def env_for_stepwise(self) -> dict[str, str]:
        """The same settings as the environment of a Stepwise process."""
        return {"STEPWISE_OIDC_CLIENT_ID": CLIENT_ID, "STEPWISE_OIDC_CLIENT_SECRET": CLIENT_SECRET,
                "STEPWISE_OIDC_ISSUER": f"{self.url}/o",
                "STEPWISE_OIDC_AUTHORIZATION_ENDPOINT": f"{self.url}/o/authorize/",
                "STEPWISE_OIDC_TOKEN_ENDPOINT": f"{self.url}/o/token/",
                "STEPWISE_OIDC_USERINFO_ENDPOINT": f"{self.url}/o/userinfo/",
                "STEPWISE_OIDC_JWKS_ENDPOINT": f"{self.url}/o/.well-known/jwks.json"}


def sign_in_at_provider(start_url: str, username: str, password: str, *,
                        allow: bool = True) -> str:
    """Follow Stepwise's redirect `start_url` at the provider as a person with a browser would,
    without one: sign in, authorize (or cancel); return where the provider sends the person
    back (the callback URL with the code, or with the error)."""
    import requests

    idp = requests.Session()
    login_page = idp.get(start_url, timeout=10)
    login_page.raise_for_status()
    fields = _form_fields(login_page.text)
    consent = idp.post(login_page.url, data={**fields, "username": username,
                                             "password": password}, timeout=10)
    consent.raise_for_status()
    back = idp.post(consent.url, data={**_form_fields(consent.text), **({"allow": "Authorize"} if allow else {})},
                    allow_redirects=False, timeout=10)
    assert back.status_code == 302, back.text[-2000:]
    return back.headers["Location"]


def _form_fields(page: str) -> dict[str, str]:
    """The hidden inputs (the CSRF token, the authorization request) of the page's form."""
    from html.parser import HTMLParser

    fields: dict[str, str] = {}

    class Inputs(HTMLParser):
        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            if tag == "input" and attrs.get("type") == "hidden" and attrs.get("name"):
                fields[attrs["name"]] = attrs.get("value") or ""

    Inputs().feed(page)
    return fields
