"""Secure by default (orchestrator/operations/deployment.py, docs/security.md).

Settings are read once per process, so each case imports them in a fresh Python process with
the environment under test, the way a server, a worker or `manage.py` starts.
"""
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
# What a production deployment sets (docker-compose.yml and .env); each case spoils one.
PRODUCTION = {
    "STEPWISE_ENV": "production",
    "DJANGO_SECRET_KEY": secrets.token_urlsafe(64),
    "DJANGO_ALLOWED_HOSTS": "stepwise.example.com",
    "AUDIT_REDACTION_KEY": secrets.token_urlsafe(64),
    "STEPWISE_TRIGGER_KEY": secrets.token_urlsafe(64),
}
SHOW = ("from django.conf import settings as s; "
        "print(repr((s.DEBUG, s.ALLOWED_HOSTS, s.SECRET_KEY, s.AUDIT_REDACTION_KEY)))")


def start(tmp_path: Path, args: list[str], **env: str | None) -> subprocess.CompletedProcess:
    """Run `python args...` as a new process with only `env` configured (None unsets)."""
    inherited = {k: v for k, v in os.environ.items()
                 if not k.startswith(("DJANGO_", "STEPWISE_", "AUDIT_", "CELERY_", "PYTEST_"))
                 and k not in ("DATABASE_URL", "REDIS_URL")}
    chosen = {k: v for k, v in env.items() if v is not None}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**inherited, "DJANGO_SETTINGS_MODULE": "orchestrator.settings",
             "STEPWISE_VAR_DIR": str(tmp_path / "var"), **chosen})


@pytest.mark.parametrize("spoiled, says", [
    pytest.param({"DJANGO_DEBUG": "true"}, "DJANGO_DEBUG is on", id="debug-on"),
    pytest.param({"DJANGO_SECRET_KEY": None}, "DJANGO_SECRET_KEY is not set", id="no-secret"),
    pytest.param({"DJANGO_SECRET_KEY": "change-me"},
                 "DJANGO_SECRET_KEY is the placeholder 'change-me'", id="compose-placeholder"),
    pytest.param({"DJANGO_SECRET_KEY": "stepwise-insecure-development-key"},
                 "DJANGO_SECRET_KEY is the placeholder", id="old-default-secret"),
    pytest.param({"DJANGO_SECRET_KEY": "ab" * 40}, "DJANGO_SECRET_KEY is too weak", id="weak-secret"),
    pytest.param({"DJANGO_ALLOWED_HOSTS": "*"}, "DJANGO_ALLOWED_HOSTS contains '*'", id="any-host"),
    pytest.param({"DJANGO_ALLOWED_HOSTS": "stepwise.example.com,*"},
                 "DJANGO_ALLOWED_HOSTS contains '*'", id="a-host-and-any-host"),
    pytest.param({"DJANGO_ALLOWED_HOSTS": None}, "DJANGO_ALLOWED_HOSTS is not set", id="no-hosts"),
    pytest.param({"AUDIT_REDACTION_KEY": None}, "AUDIT_REDACTION_KEY is not set", id="no-redaction-key"),
    pytest.param({"AUDIT_REDACTION_KEY": PRODUCTION["DJANGO_SECRET_KEY"]},
                 "AUDIT_REDACTION_KEY equals DJANGO_SECRET_KEY", id="redaction-key-is-secret-key"),
    pytest.param({"STEPWISE_TRIGGER_KEY": None}, "STEPWISE_TRIGGER_KEY is not set", id="no-trigger-key"),
    pytest.param({"STEPWISE_TRIGGER_KEY": PRODUCTION["AUDIT_REDACTION_KEY"]},
                 "STEPWISE_TRIGGER_KEY equals another key", id="trigger-key-is-redaction-key"),
    pytest.param({"STEPWISE_ENV": "prod"},
                 "STEPWISE_ENV must be 'development' or 'production', not 'prod'", id="env-typo"),
])
def test_production_settings_refuse_to_start_with_an_insecure_value(tmp_path, spoiled, says):
    started = start(tmp_path, ["-c", SHOW], **{**PRODUCTION, **spoiled})

    assert started.returncode != 0, started.stdout
    assert "django.core.exceptions.ImproperlyConfigured" in started.stderr
    assert says in started.stderr, started.stderr[-2000:]


def test_production_settings_start_with_secure_values_and_generate_nothing(tmp_path):
    started = start(tmp_path, ["-c", SHOW + "; print(s.SESSION_COOKIE_SECURE, s.SECURE_SSL_REDIRECT)"],
                    **PRODUCTION)

    assert started.returncode == 0, started.stderr[-2000:]
    shown = started.stdout.splitlines()
    assert eval(shown[0]) == (False, ["stepwise.example.com"], PRODUCTION["DJANGO_SECRET_KEY"],
                              PRODUCTION["AUDIT_REDACTION_KEY"])
    assert shown[1] == "True True"
    assert not (tmp_path / "var" / "secrets").exists()


def test_check_deploy_is_clean_under_the_production_settings(tmp_path):
    checked = start(tmp_path, ["manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                    **PRODUCTION)

    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "System check identified no issues (0 silenced)." in checked.stdout


def test_development_turns_debug_off_answers_loopback_only_and_generates_its_own_secrets(tmp_path):
    first = start(tmp_path, ["-c", SHOW])
    again = start(tmp_path, ["-c", SHOW])
    elsewhere = start(tmp_path / "other", ["-c", SHOW])
    debugging = start(tmp_path, ["-c", SHOW], DJANGO_DEBUG="1")

    debug, hosts, secret_key, redaction_key = eval(first.stdout)
    assert (debug, hosts) == (False, ["localhost", "127.0.0.1", "[::1]"])
    stored = tmp_path / "var" / "secrets"
    assert secret_key == (stored / "django-secret-key").read_text().strip()
    assert redaction_key == (stored / "audit-redaction-key").read_text().strip()
    assert len(secret_key) >= 50 and redaction_key != secret_key
    assert oct((stored / "django-secret-key").stat().st_mode & 0o777) == "0o600"
    assert eval(again.stdout) == (debug, hosts, secret_key, redaction_key)  # reused
    assert eval(elsewhere.stdout)[2:] != (secret_key, redaction_key)       # never shared
    assert eval(debugging.stdout)[0] is True                                 # only when asked


def test_the_ledgers_redaction_hashes_do_not_derive_from_the_secret_key(tmp_path):
    code = ("import django; django.setup(); from audit.redaction import keyed_hash; "
            "print(keyed_hash('carol@example.com'))")

    one = start(tmp_path, ["-c", code], DJANGO_SECRET_KEY="a" + secrets.token_urlsafe(60))
    other = start(tmp_path, ["-c", code], DJANGO_SECRET_KEY="b" + secrets.token_urlsafe(60))

    assert one.returncode == other.returncode == 0, one.stderr[-2000:] + other.stderr[-2000:]
    assert one.stdout == other.stdout  # rotating SECRET_KEY leaves redaction hashes alone


def test_docker_compose_holds_no_literal_secret_and_requires_each_one():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    environments = [compose["x-app"]["environment"]] + [
        service.get("environment") or {} for service in compose["services"].values()]

    required = {"DJANGO_SECRET_KEY", "AUDIT_REDACTION_KEY", "POSTGRES_PASSWORD", "DJANGO_ALLOWED_HOSTS",
                "STEPWISE_TRIGGER_KEY"}
    for environment in environments:
        for name, value in environment.items():
            if name in required:
                assert str(value).startswith(f"${{{name}:?"), (name, value)
            elif any(w in name for w in ("SECRET", "PASSWORD", "KEY")) and not name.endswith("_FILE"):
                assert str(value).startswith(f"${{{name}:-"), (name, value)
        if "DATABASE_URL" in environment:
            assert "${POSTGRES_PASSWORD:?" in environment["DATABASE_URL"]
    assert compose["x-app"]["environment"]["STEPWISE_ENV"] == "production"
    assert compose["secrets"]["audit_signing_key"]["file"].startswith("${AUDIT_SIGNING_KEY_PATH:?")
    assert "STEPWISE_ENV=production" in (ROOT / "Dockerfile").read_text()


def test_the_web_process_freezes_what_it_loaded_so_full_collections_skip_it(tmp_path):
    # A full collection walks every object the process holds; in a web process, most of them
    # are the code it loaded, and walking them paused a request for tens of milliseconds.
    started = start(tmp_path, ["-c", "import gc, orchestrator.asgi; print(gc.get_freeze_count())"])
    assert started.returncode == 0, started.stderr
    assert int(started.stdout.split()[-1]) > 10_000
