"""How log lines look and what they must never contain.

`ContextFilter` puts the ids bound in `orchestrator.logcontext` (run, step, attempt, workflow,
team, trace) on every record; `RedactFilter` replaces what `audit.redaction` calls a secret
(bearer tokens, API keys, values under keys such as `password` or `api_key`) in the message, its
arguments, the extra fields and the traceback, so no secret reaches a log. `JsonFormatter` writes
one JSON object per line (production: STEPWISE_LOG_FORMAT=json, the default with
STEPWISE_ENV=production); `TextFormatter` one readable line (`make run`). The settings' LOGGING
attaches both filters to the handler, so every logger's lines pass through them. Nothing here
writes anything but log lines.
"""
import json
import logging
from datetime import UTC, datetime

from audit.redaction import SECRET_PATTERNS, is_secret_key

from .logcontext import FIELDS, current

MASK = "***"
# Attributes every LogRecord has; anything else on a record came in through `extra`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime",
                                                                       "taskName"}


def scrub(text: str) -> str:
    """`text` with every well-known secret format replaced by ***."""
    for pattern in SECRET_PATTERNS:
        text = pattern.sub(MASK, text)
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
