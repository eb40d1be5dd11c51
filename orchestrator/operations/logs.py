"""How log lines look and what they must never contain.

`ContextFilter` puts the ids bound in `orchestrator.operations.logcontext` (run, step, attempt,
workflow, team, trace) on every record; `RedactFilter` replaces what `audit.redaction` calls a
secret (bearer tokens, API keys, values under keys such as `password` or `api_key` — in a URL's
query, a header line or a JSON body too) and every secret run input this process revealed
(`logcontext.mask_in_logs`) in the message, its arguments, the extra fields and the traceback,
so no secret reaches a log. `configure` (the settings' LOGGING_CONFIG, so every process kind —
web, workers, beat, the event consumer — passes through it) also scrubs each record as it is
created, so a library's logger with handlers of its own (uvicorn's access log) is redacted the
same way. `JsonFormatter` writes
one JSON object per line (production: STEPWISE_LOG_FORMAT=json, the default with
STEPWISE_ENV=production); `TextFormatter` one readable line (`make run`). The settings' LOGGING
attaches both filters to the handler, so every logger's lines pass through them. Nothing here
writes anything but log lines.
"""
import json
import logging
import logging.config
import re
from datetime import UTC, datetime

from audit.redaction import SECRET_PATTERNS, is_secret_key

from .logcontext import FIELDS, current, masked_values

MASK = "***"
# `name=value` in a URL's query or a form, `Name: value` in a header line, `"name": "value"` in
# JSON or a dict's repr, `(b'name', b'value')` in a header list (httpcore's debug lines): the value is masked when the name names a secret (`is_secret_key`), or,
# in a query, is one of QUERY_SECRETS.
_NAMED_VALUE = re.compile(
    r"""(?P<sep>[?&;]|\b)(?P<name>[A-Za-z][\w.-]{0,63})"""
    r"""(?P<eq>["']?\s*[:=]\s*(?:(?-i:b)["'])?["']?|["']\s*,\s*(?-i:b)?["'])"""
    r"""(?P<value>(?:(?:bearer|basic)\s+)?[^\s"'&;,)}\]]+)""", re.IGNORECASE)
QUERY_SECRETS = frozenset({"key", "sig", "signature", "code"})
# Attributes every LogRecord has; anything else on a record came in through `extra`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime",
                                                                       "taskName"}


def _named(match: re.Match) -> str:
    name = match["name"]
    secret = is_secret_key(name) or (match["sep"] in "?&;" and match["sep"] != ""
                                      and name.lower() in QUERY_SECRETS)
    if not secret or match["value"] == MASK or "%" in match["value"]:
        return match[0]  # masked already, or a format placeholder its argument fills
    return match[0][:match.start("value") - match.start()] + MASK


def scrub(text: str) -> str:
    """`text` with every well-known secret format, every value named as a secret and every
    secret value this process revealed replaced by ***."""
    for pattern in SECRET_PATTERNS:
        text = pattern.sub(MASK, text)
    text = _NAMED_VALUE.sub(_named, text)
    for value in masked_values():
        if value in text:
            text = text.replace(value, MASK)
    return text


def _clean(value):
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        if "redacted" in value and "summary" in value:  # an audit marker: say only that
            return MASK
        return {k: MASK if is_secret_key(str(k)) else _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_clean(v) for v in value)
    return value


class ContextFilter(logging.Filter):
    """Put the bound ids on the record (an id passed in `extra` wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        ids = current()
        for field in FIELDS:
            if getattr(record, field, None) in (None, ""):
                setattr(record, field, ids.get(field, ""))
        return True


class RedactFilter(logging.Filter):
    """Render the message once, without secrets; mask secret extra fields and tracebacks."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: keep what there is, still scrubbed
            message = f"{record.msg} {record.args}"
        record.msg, record.args = scrub(message), ()
        for key in set(vars(record)) - _STANDARD - set(FIELDS):
            value = getattr(record, key)
            setattr(record, key, MASK if is_secret_key(key) else _clean(value))
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text)
        record.exc_info = None  # the (scrubbed) text is what is printed
        return True


def _scrubbed_arg(value):
    """A record argument without secrets, of its own type when it holds none (a number for
    `%d`, an object a library's formatter reads)."""
    if isinstance(value, int | float | bool) or value is None:
        return value
    if isinstance(value, dict | list | tuple):
        return _clean(value)
    text = str(value)
    clean = scrub(text)
    return value if clean == text else clean


def _scrub_at_creation(record: logging.LogRecord) -> None:
    if isinstance(record.msg, str):
        record.msg = scrub(record.msg)
    if isinstance(record.args, tuple):
        record.args = tuple(_scrubbed_arg(a) for a in record.args)
    elif isinstance(record.args, dict):
        record.args = _clean(record.args)


def configure(config: dict) -> None:
    """Django's LOGGING_CONFIG: the settings' LOGGING, and every record of every logger
    scrubbed as it is created, whichever handler prints it (a library's own included)."""
    logging.config.dictConfig(config)
    factory = logging.getLogRecordFactory()
    if getattr(factory, "stepwise_redacts", False):
        return

    def scrubbing_factory(*args, **kwargs) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        try:
            _scrub_at_creation(record)
        except Exception:  # noqa: BLE001 - never lose a line; the handler's filter still runs
            pass
        return record

    scrubbing_factory.stepwise_redacts = True
    logging.setLogRecordFactory(scrubbing_factory)


def extras(record: logging.LogRecord) -> dict:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and k not in FIELDS}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the ids, extra fields, error."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **{field: getattr(record, field, "") or None for field in FIELDS},
            "process": record.process,
            **extras(record),
        }
        if record.exc_text:
            line["error"] = record.exc_text
        return json.dumps(line, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """`time level logger [run=… step=… attempt=… trace=…] message`, ids only when set."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s%(ids)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        ids = [f"{f.removesuffix('_id')}={getattr(record, f)}" for f in FIELDS
               if getattr(record, f, "")]
        record.ids = f" [{' '.join(ids)}]" if ids else ""
        return super().format(record)
