"""Named connections: what the integration tools may reach, as an operator defined it.

Owns the STEPWISE_CONNECTIONS setting's format, its checks, and `connection_get` (the one way a
tool or a save-time check finds a connection). A definition names a connection (`connection:
warehouse`); it never holds an address, a user or a password. Each connection says what it is
for (`kind`), which teams may use it (`teams`; absent: every team) and what it allows (writes,
exchanges, topics, recipient domains, size and row limits), so a definition gets no more than
the operator granted.

Credentials are never written in the setting itself: a secret field is `{"env": "NAME"}` (an
environment variable) or `{"file": "/run/secrets/name"}` (a secrets file, read at each use so a
rotation needs no restart), and a URL with a password in it is refused. `Connection` keeps only
the references; `secret(...)` resolves one at the moment of use, and `scrub(...)` removes every
resolved value from a message before it reaches a step's error, a log or the ledger.

Reads settings, the environment and secret files; never the database or the network.
"""
from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings
from django.core import checks

from orchestrator.engine.retry import StepError

# Each kind, the fields it accepts (besides kind, teams and description), and which of them are
# secrets (a {"env"} or {"file"} reference, never a literal).
KINDS: dict[str, dict[str, set[str]]] = {
    "sql": {"fields": {"url", "password", "writes", "max_rows", "timeout_s",
                       "idempotency_table"},
            "secrets": {"password"}},
    "files": {"fields": {"backend", "root", "bucket", "prefix", "endpoint_url", "region",
                         "access_key_id", "secret_access_key", "writes", "max_bytes",
                         "max_entries", "timeout_s"},
              "secrets": {"access_key_id", "secret_access_key"}},
    "rabbitmq": {"fields": {"url", "username", "password", "exchanges", "timeout_s"},
                 "secrets": {"password"}},
    "redis": {"fields": {"url", "password", "key_prefix", "max_len", "dedupe_ttl_s",
                         "timeout_s"},
              "secrets": {"password"}},
    "mqtt": {"fields": {"host", "port", "username", "password", "topics", "qos", "timeout_s"},
             "secrets": {"password"}},
    "mail": {"fields": {"backend", "host", "port", "username", "password", "use_tls",
                        "use_ssl", "path", "from_email", "allowed_domains", "timeout_s",
                        "message_id_domain"},
             "secrets": {"password"}},
    "http": {"fields": {"base_url", "auth", "timeout_s"}, "secrets": set()},
}
# Fields whose value may itself be a secret reference (a whole URL with its password in it).
_URL_FIELDS = {"url"}
HTTP_AUTH_TYPES = {"bearer": {"token"}, "basic": {"username", "password"},
                   "header": {"name", "value"}}
_HTTP_AUTH_SECRETS = {"token", "password", "value"}


class ConnectionRefused(StepError):
    """A named connection that is missing, of the wrong kind, not granted to the team, or
    whose credential cannot be read. A step failing with it fails as `policy`: never worth
    retrying, the configuration must change."""

    def __init__(self, message: str):
        super().__init__("policy", message)


def _is_ref(value: object) -> bool:
    return (isinstance(value, dict) and len(value) == 1
            and set(value) <= {"env", "file"} and isinstance(next(iter(value.values())), str))


@dataclass(frozen=True)
class Connection:
    """One named connection. `options` hold what the setting says, secrets as references."""

    name: str
    kind: str
    options: Mapping[str, object] = field(repr=False)
    teams: tuple[str, ...] | None = None
    description: str = ""

    def get(self, key: str, default=None):
        return self.options.get(key, default)

    def secret(self, key: str, *, within: Mapping | None = None) -> str | None:
        """The credential `key` refers to (None when the connection has none).
        Raises ConnectionRefused when it cannot be read."""
        ref = (within if within is not None else self.options).get(key)
        if ref is None:
            return None
        if isinstance(ref, str):  # a plain URL (its password is refused by the checks)
            return ref
        return _resolve(ref, f"connection '{self.name}' field '{key}'")

    def secret_values(self) -> list[str]:
        """Every credential this connection resolves to, to scrub from messages."""
        values = []
        for key, ref in self.options.items():
            refs = ref.items() if key == "auth" and isinstance(ref, dict) else [(key, ref)]
            for _, item in refs:
                if _is_ref(item):
                    try:
                        values.append(_resolve(item, ""))
                    except ConnectionRefused:
                        continue
        return [v for v in values if v and len(v) >= 3]

    def scrub(self, text: str) -> str:
        """`text` without any of this connection's credentials in it."""
        for value in self.secret_values():
            text = text.replace(value, "[redacted]")
            password = urlsplit(value).password if "://" in value else None
            if password:
                text = text.replace(password, "[redacted]")
        return text

    def allows_team(self, team: str) -> bool:
        return self.teams is None or team in self.teams


def _resolve(ref: dict, what: str) -> str:
    if "env" in ref:
        value = os.environ.get(ref["env"])
        if value is None:
            raise ConnectionRefused(f"{what}: environment variable {ref['env']} is not set")
        return value
    try:
        return Path(ref["file"]).read_text().strip()
    except OSError as exc:
        raise ConnectionRefused(f"{what}: secrets file {ref['file']} cannot be read "
                                f"({exc.strerror or type(exc).__name__})") from None


def _configured() -> dict:
    value = getattr(settings, "STEPWISE_CONNECTIONS", {}) or {}
    return value if isinstance(value, dict) else {}


def connection_get(name: object, *, kind: str, team: str) -> Connection:
    """The connection `name` of `kind` that `team` may use. Raises ConnectionRefused."""
    if not isinstance(name, str) or not name:
        raise ConnectionRefused("a connection must be named")
    raw = _configured().get(name)
    if not isinstance(raw, dict):
        raise ConnectionRefused(f"no connection named '{name}' is configured "
                                f"({_known(kind)}; STEPWISE_CONNECTIONS)")
    problems = list(entry_problems(name, raw))
    if problems:
        raise ConnectionRefused(f"connection '{name}' is misconfigured: {problems[0]}")
    if raw["kind"] != kind:
        raise ConnectionRefused(f"connection '{name}' is a {raw['kind']} connection, "
                                f"not {kind}")
    connection = _connection(name, raw)
    if not connection.allows_team(team):
        raise ConnectionRefused(f"connection '{name}' is not granted to team '{team}'")
    return connection


def connection_kind(name: object) -> str | None:
    """The kind of the configured connection `name`, or None when there is none."""
    raw = _configured().get(name) if isinstance(name, str) else None
    return raw.get("kind") if isinstance(raw, dict) else None


def connections_for(*, kind: str, teams: set[str] | None) -> list[str]:
    """Names of the well-formed connections of `kind` any of `teams` may use (None: all)."""
    names = []
    for name, raw in sorted(_configured().items()):
        if not isinstance(raw, dict) or raw.get("kind") != kind or list(entry_problems(name, raw)):
            continue
        granted = raw.get("teams")
        if teams is None or granted is None or set(granted) & teams:
            names.append(name)
    return names


def _known(kind: str) -> str:
    names = connections_for(kind=kind, teams=None)
    return f"{kind} connections: {', '.join(names)}" if names else f"no {kind} connections exist"


def _connection(name: str, raw: dict) -> Connection:
    teams = raw.get("teams")
    options = {k: v for k, v in raw.items() if k not in ("kind", "teams", "description")}
    return Connection(name, raw["kind"], options, tuple(teams) if teams is not None else None,
                      raw.get("description", ""))


def entry_problems(name: str, raw: object) -> Iterator[str]:
    """What is wrong with one connection's entry in the setting."""
    if not isinstance(raw, dict):
        yield "must be a mapping"
        return
    kind = raw.get("kind")
    if kind not in KINDS:
        yield f"kind must be one of {', '.join(sorted(KINDS))}, not {kind!r}"
        return
    spec = KINDS[kind]
    for key in sorted(set(raw) - spec["fields"] - {"kind", "teams", "description"}):
        yield f"unknown field {key!r} for a {kind} connection"
    teams = raw.get("teams")
    if teams is not None and not (isinstance(teams, list) and all(isinstance(t, str) for t in teams)):
        yield "teams must be a list of team slugs"
    for key in sorted(spec["secrets"] & set(raw)):
        if not _is_ref(raw[key]):
            yield (f"{key} must come from the environment or a secrets file "
                   f'({{"env": "NAME"}} or {{"file": "/path"}}), never a literal value')
    for key in sorted(_URL_FIELDS & set(raw)):
        value = raw[key]
        if _is_ref(value):
            continue
        if not isinstance(value, str):
            yield f"{key} must be a URL or a secret reference"
        elif urlsplit(value).password:
            yield (f"{key} carries a password; put it in the password field as "
                   f'{{"env": ...}} or {{"file": ...}}, or make the whole URL a reference')
    for key in ("writes", "use_tls", "use_ssl"):
        if key in raw and not isinstance(raw[key], bool):
            yield f"{key} must be true or false"
    for key in ("max_rows", "max_bytes", "max_entries", "max_len", "port", "dedupe_ttl_s", "qos"):
        if key in raw and (not isinstance(raw[key], int) or isinstance(raw[key], bool)
                           or raw[key] < 0):
            yield f"{key} must be a non-negative integer"
    if "timeout_s" in raw and (not isinstance(raw["timeout_s"], int | float)
                               or isinstance(raw["timeout_s"], bool) or raw["timeout_s"] <= 0):
        yield "timeout_s must be a positive number"
    for key in ("exchanges", "topics", "allowed_domains"):
        if key in raw and not (isinstance(raw[key], list)
                               and all(isinstance(v, str) for v in raw[key])):
            yield f"{key} must be a list of strings"
    yield from _kind_problems(kind, raw)


def _kind_problems(kind: str, raw: dict) -> Iterator[str]:
    if kind == "sql":
        url = raw.get("url")
        if url is None:
            yield "url is required"
        elif isinstance(url, str) and urlsplit(url).scheme.split("+")[0] not in (
                "sqlite", "postgresql", "postgres", "mysql", "mariadb"):
            yield "url must be a sqlite://, postgresql:// or mysql:// URL"
    elif kind == "files":
        backend = raw.get("backend", "local")
        if backend == "local" and not isinstance(raw.get("root"), str):
            yield "root (a directory) is required for the local backend"
        elif backend == "s3" and not isinstance(raw.get("bucket"), str):
            yield "bucket is required for the s3 backend"
        elif backend not in ("local", "s3"):
            yield f"backend must be local or s3, not {backend!r}"
    elif kind in ("rabbitmq", "redis") and "url" not in raw:
        yield "url is required"
    elif kind == "mqtt" and not isinstance(raw.get("host"), str):
        yield "host is required"
    elif kind == "mail":
        backend = raw.get("backend", "smtp")
        if backend not in ("smtp", "file"):
            yield f"backend must be smtp or file, not {backend!r}"
        elif backend == "file" and not isinstance(raw.get("path"), str):
            yield "path (a directory) is required for the file backend"
        if not isinstance(raw.get("from_email"), str):
            yield "from_email is required"
    elif kind == "http":
        base = raw.get("base_url")
        if not (isinstance(base, str) and urlsplit(base).scheme in ("http", "https")):
            yield "base_url must be an http:// or https:// URL"
        auth = raw.get("auth")
        if auth is not None:
            yield from _auth_problems(auth)


def _auth_problems(auth: object) -> Iterator[str]:
    if not isinstance(auth, dict) or auth.get("type") not in HTTP_AUTH_TYPES:
        yield f"auth must be a mapping with type {', '.join(sorted(HTTP_AUTH_TYPES))}"
        return
    needed = HTTP_AUTH_TYPES[auth["type"]]
    for key in sorted(needed - set(auth)):
        yield f"auth of type {auth['type']} needs {key}"
    for key in sorted(set(auth) - needed - {"type"}):
        yield f"unknown auth field {key!r}"
    for key in sorted(_HTTP_AUTH_SECRETS & set(auth)):
        if not _is_ref(auth[key]):
            yield (f"auth {key} must come from the environment or a secrets file "
                   f'({{"env": "NAME"}} or {{"file": "/path"}})')


def config_problems() -> list[str]:
    """Every problem with the STEPWISE_CONNECTIONS setting (for `manage.py check`)."""
    value = getattr(settings, "STEPWISE_CONNECTIONS", {})
    if not isinstance(value, dict):
        return ["STEPWISE_CONNECTIONS must be a mapping of connection names to connections"]
    return [f"STEPWISE_CONNECTIONS['{name}']: {problem}"
            for name, raw in value.items() for problem in entry_problems(name, raw)]


@checks.register(checks.Tags.security)
def check_connections_setting(app_configs, **kwargs) -> list[checks.CheckMessage]:
    """A malformed connection (or a password written into it) stops start-up, not a step."""
    return [checks.Error(problem, id="stepwise.connections.E001") for problem in config_problems()]
