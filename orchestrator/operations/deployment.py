"""How this process is deployed, and the secrets and switches that follow from it.

Imported by `orchestrator.settings` before Django is configured, so it reads only the
environment and files, and must not import Django settings, models or apps.

Two environments, chosen by `STEPWISE_ENV` (see docs/security.md):

- `development` (the default: `make run`, the test suite, a developer's shell). Nothing
  needs configuring, and nothing insecure is shared between installations: DEBUG is off
  unless `DJANGO_DEBUG` turns it on, hosts are loopback only, and every secret this process
  needs and was not given is generated once into `var/secrets/` (mode 0600) and reused.
- `production` (set by the Dockerfile and docker-compose.yml). Nothing is generated and
  nothing insecure is accepted: `require_production` refuses to start with DEBUG on, a
  missing, default or weak `DJANGO_SECRET_KEY`, missing or wildcard `DJANGO_ALLOWED_HOSTS`,
  a missing `AUDIT_REDACTION_KEY` (or one equal to the secret key), or a missing
  `STEPWISE_TRIGGER_KEY` (the key that encrypts webhook secrets).

Any other value of STEPWISE_ENV is refused: a typo must not silently mean "development".
"""
from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

DEVELOPMENT, PRODUCTION = "development", "production"
ENVIRONMENTS = (DEVELOPMENT, PRODUCTION)
# Values that have been shipped or suggested as placeholders; never a production secret.
KNOWN_PLACEHOLDERS = frozenset({
    "change-me", "changeme", "secret", "stepwise-insecure-development-key",
})
# Django's own bar for SECRET_KEY (security.W009), so `check --deploy` agrees with us.
SECRET_KEY_MIN_LENGTH, SECRET_KEY_MIN_UNIQUE = 50, 5
REDACTION_KEY_MIN_LENGTH = 32
DEVELOPMENT_HOSTS = ("localhost", "127.0.0.1", "[::1]")

_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}


def environment(env: Mapping[str, str] = os.environ) -> str:
    """`STEPWISE_ENV`, checked. Raises ImproperlyConfigured for an unknown value."""
    value = env.get("STEPWISE_ENV", "").strip().lower() or DEVELOPMENT
    if value not in ENVIRONMENTS:
        raise ImproperlyConfigured(
            f"STEPWISE_ENV must be 'development' or 'production', not {env['STEPWISE_ENV']!r}")
    return value


def env_bool(name: str, default: bool, env: Mapping[str, str] = os.environ) -> bool:
    """A boolean variable. Raises ImproperlyConfigured for a value that is not clearly one."""
    value = env.get(name)
    if value is None:
        return default
    if value.strip().lower() in _TRUE:
        return True
    if value.strip().lower() in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be true or false (1/0, yes/no, on/off), not {value!r}")


def env_list(name: str, default: str = "", env: Mapping[str, str] = os.environ) -> list[str]:
    return [item.strip() for item in env.get(name, default).split(",") if item.strip()]


def local_secret(path: Path) -> str:
    """The secret stored at `path`, generated there (mode 0600) on first use.

    For development only. Several processes may start at once (`make run`, pytest-xdist
    workers): the file is written whole under a temporary name and linked into place, which
    fails if another process got there first, so every process reads the same complete value.
    """
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(secrets.token_urlsafe(64) + "\n")
        try:
            os.link(temporary, path)
        except FileExistsError:
            pass
        finally:
            temporary.unlink()
    return path.read_text().strip()


def secret_key_problem(value: str) -> str | None:
    """Why `value` is not acceptable as a production DJANGO_SECRET_KEY, or None."""
    if not value:
        return "is not set"
    if value.strip().lower() in KNOWN_PLACEHOLDERS:
        return f"is the placeholder {value!r}"
    if value.startswith("django-insecure-"):
        return "is a key Django generated for development ('django-insecure-...')"
    if len(value) < SECRET_KEY_MIN_LENGTH or len(set(value)) < SECRET_KEY_MIN_UNIQUE:
        return (f"is too weak (at least {SECRET_KEY_MIN_LENGTH} characters and "
                f"{SECRET_KEY_MIN_UNIQUE} different ones)")
    return None


def production_problems(*, debug: bool, secret_key: str, secret_key_fallbacks: list[str],
                        allowed_hosts: list[str], redaction_key: str,
                        trigger_key: str | None = None) -> list[str]:
    """Every reason the production settings must not start, each naming its variable."""
    problems = []
    if debug:
        problems.append("DJANGO_DEBUG is on: a 500 would show settings and tracebacks to anyone")
    if reason := secret_key_problem(secret_key):
        problems.append(f"DJANGO_SECRET_KEY {reason}")
    for index, fallback in enumerate(secret_key_fallbacks):
        if reason := secret_key_problem(fallback):
            problems.append(f"DJANGO_SECRET_KEY_FALLBACKS entry {index + 1} {reason}")
    if not allowed_hosts:
        problems.append("DJANGO_ALLOWED_HOSTS is not set (the host names this site answers to)")
    elif "*" in allowed_hosts:
        problems.append("DJANGO_ALLOWED_HOSTS contains '*': list the host names this site answers to")
    if not redaction_key:
        problems.append("AUDIT_REDACTION_KEY is not set (the key of the ledger's redaction hashes)")
    elif redaction_key == secret_key:
        problems.append("AUDIT_REDACTION_KEY equals DJANGO_SECRET_KEY: they must be separate secrets")
    elif len(redaction_key) < REDACTION_KEY_MIN_LENGTH:
        problems.append(f"AUDIT_REDACTION_KEY is too short (at least {REDACTION_KEY_MIN_LENGTH} characters)")
    if trigger_key is not None:  # the key that encrypts webhook secrets (triggers/sealing.py)
        if not trigger_key:
            problems.append("STEPWISE_TRIGGER_KEY is not set (the key that encrypts webhook secrets)")
        elif trigger_key in (secret_key, redaction_key):
            problems.append("STEPWISE_TRIGGER_KEY equals another key: it must be a secret of its own")
        elif len(trigger_key) < REDACTION_KEY_MIN_LENGTH:
            problems.append(f"STEPWISE_TRIGGER_KEY is too short (at least {REDACTION_KEY_MIN_LENGTH} characters)")
    return problems


def require_production(**settings_values) -> None:
    """Raise ImproperlyConfigured listing every problem `production_problems` finds."""
    problems = production_problems(**settings_values)
    if problems:
        raise ImproperlyConfigured(
            "STEPWISE_ENV=production refuses to start:\n  - " + "\n  - ".join(problems)
            + "\nSee docs/security.md for how to set each one.")
