"""E-mail: `mail.send` through Django's mail framework on a named `mail` connection (SMTP, or
files in a directory for development).

* The subject, text body and optional HTML body are templates like every param: the engine
  renders them over the step's input (sandboxed Jinja) before the tool sees them.
* Every recipient (to, cc, bcc, reply_to) must be in the allowed domains: the step's
  `allowed_domains` (literal in the definition) and the connection's, both where both are
  given - checked with the risk rules' recipient check (`orchestrator.engine.risk.in_scope`), when
  the definition is saved for literal recipients and again at run time for rendered ones. With no
  allowed domains declared anywhere nothing is sent.
* The Message-ID is derived from the step's idempotency key (`<uuid@domain>`), so a send repeated
  after a worker died mid-call carries the same Message-ID and a receiving system that drops
  repeated Message-IDs shows it once. SMTP cannot be asked whether it delivered a message, so
  there is no lookup: a repeat is at-least-once with one identity (`dedupes_by_key`).

SMTP answers are classified for the retry policy: 421 (the server is busy or limiting) is
`rate_limit`, other 4xx `transient`, 530/534/535 `auth`, other 5xx `permanent`; a refused or
dropped connection is `transient`, a silent server `timeout`.
"""
import smtplib
import socket

from django.core.mail import BadHeaderError, EmailMultiAlternatives, get_connection

from orchestrator.engine.definitions import contains_template
from orchestrator.engine.retry import StepError
from orchestrator.engine.risk import in_scope

from ..connections import Connection
from .named import CONNECTION_PARAM, connection_for, deadline_s, failure, message_id
from .registry import FENCING_HEADER, ToolContext, tool

_ADDRESS = {"type": "string", "minLength": 3, "maxLength": 320, "pattern": r"^[^@\s<>,;]+@[^@\s<>,;]+$"}
_ADDRESSES = {"type": "array", "items": _ADDRESS, "maxItems": 50}
MAIL_PARAMS = {
    "type": "object", "additionalProperties": False,
    "required": ["connection", "to", "subject", "body"],
    "properties": {
        "connection": CONNECTION_PARAM,
        "to": {**_ADDRESSES, "minItems": 1}, "cc": _ADDRESSES, "bcc": _ADDRESSES,
        "reply_to": _ADDRESSES,
        "subject": {"type": "string", "minLength": 1, "maxLength": 998},
        "body": {"type": "string", "maxLength": 1_000_000},
        "html": {"type": "string", "maxLength": 1_000_000},
        "allowed_domains": {"type": "array", "items": {"type": "string", "minLength": 1},
                            "minItems": 1, "maxItems": 100,
                            "description": "Every recipient must be at one of these domains "
                                           "(or be one of these addresses)."},
        "timeout_s": {"type": "number", "exclusiveMinimum": 0, "default": 30},
    },
}
MAIL_OUTPUT = {"type": "object", "required": ["message_id", "recipients"],
               "properties": {"message_id": {"type": "string"},
                              "recipients": {"type": "integer"}}}
_RECIPIENT_FIELDS = ("to", "cc", "bcc", "reply_to")


def _scopes(params: dict, connection: Connection | None) -> list[list[str]]:
    scopes = []
    if isinstance(params.get("allowed_domains"), list):
        scopes.append(params["allowed_domains"])
    if connection is not None and isinstance(connection.get("allowed_domains"), list):
        scopes.append(connection.get("allowed_domains"))
    return scopes


def _strangers(params: dict, scopes: list[list[str]], *, literal_only: bool):
    for field in _RECIPIENT_FIELDS:
        values = params.get(field)
        for index, value in enumerate(values if isinstance(values, list) else []):
            if literal_only and (not isinstance(value, str) or contains_template(value)):
                continue
            if not all(in_scope(value, scope) for scope in scopes):
                yield (field, index), value


def check_mail(params: dict, connection) -> list[tuple[tuple, str]]:
    if "allowed_domains" in params and contains_template(params["allowed_domains"]):
        return [(("allowed_domains",), "allowed_domains must be literal, not a template")]
    scopes = _scopes(params, connection)
    if not scopes:
        return [(("allowed_domains",), "declare allowed_domains (here or on the connection): "
                                       "mail.send sends only to allowed recipients")]
    return [(at, f"{value!r} is outside the allowed domains")
            for at, value in _strangers(params, scopes, literal_only=True)]


def _backend(connection: Connection, seconds: float):
    if connection.get("backend", "smtp") == "file":
        return get_connection("django.core.mail.backends.filebased.EmailBackend",
                              file_path=str(connection.get("path")), fail_silently=False)
    return get_connection(
        "django.core.mail.backends.smtp.EmailBackend", fail_silently=False,
        host=str(connection.get("host") or "localhost"), port=int(connection.get("port") or 25),
        username=connection.get("username") or "", password=connection.secret("password") or "",
        use_tls=bool(connection.get("use_tls")), use_ssl=bool(connection.get("use_ssl")),
        timeout=seconds)


def _smtp_failure(connection: Connection, exc: BaseException) -> StepError:
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        codes = [code for code, _ in exc.recipients.values()]
        error_class = "transient" if codes and all(400 <= c < 500 for c in codes) else "permanent"
        return failure(connection, error_class, f"recipients refused: {exc.recipients}")
    if isinstance(exc, smtplib.SMTPResponseException):
        code = exc.smtp_code
        if code in (530, 534, 535):
            error_class = "auth"
        elif code == 421:
            error_class = "rate_limit"
        elif 400 <= code < 500:
            error_class = "transient"
        else:
            error_class = "permanent"
        return failure(connection, error_class, exc)
    if isinstance(exc, socket.timeout | TimeoutError):
        return failure(connection, "timeout", exc)
    return failure(connection, "transient", exc)  # refused, disconnected, reset ...


@tool("mail.send", params_schema=MAIL_PARAMS, output_schema=MAIL_OUTPUT, connection="mail",
      side_effect=True, dedupes_by_key=True, check=check_mail,
      description="Send an e-mail to allowed recipients; its Message-ID comes from the step.")
def mail_send(params: dict, ctx: ToolContext) -> dict:
    """Send one message through the connection's mail backend, or refuse it (`policy`) when a
    recipient is outside the allowed domains."""
    connection = connection_for(params, ctx, "mail")
    scopes = _scopes(params, connection)
    if not scopes:
        raise StepError("policy", "no allowed_domains are declared on the step or the "
                                  f"connection '{connection.name}'; nothing is sent")
    strangers = [value for _, value in _strangers(params, scopes, literal_only=False)]
    if strangers:
        shown = ", ".join(repr(v) for v in strangers[:5])
        raise StepError("policy", f"{shown} outside the allowed domains; nothing was sent")
    sender = str(connection.get("from_email"))
    domain = str(connection.get("message_id_domain") or sender.rsplit("@", 1)[-1])
    mid = f"<{message_id(ctx.idempotency_key)}@{domain}>"
    seconds = deadline_s(connection, params, ctx)
    try:
        backend = _backend(connection, seconds)
        message = EmailMultiAlternatives(
            subject=params["subject"], body=params["body"], from_email=sender, to=params["to"],
            cc=params.get("cc"), bcc=params.get("bcc"), reply_to=params.get("reply_to"),
            headers={"Message-ID": mid, "X-Stepwise-Step": ctx.step_name,
                     FENCING_HEADER: str(ctx.fencing_token)}, connection=backend)
        if params.get("html"):
            message.attach_alternative(params["html"], "text/html")
        sent = message.send()
    except (BadHeaderError, ValueError) as exc:
        raise failure(connection, "validation", exc) from exc
    except (smtplib.SMTPException, OSError) as exc:
        raise _smtp_failure(connection, exc) from exc
    if not sent:
        raise StepError("transient", "the mail backend sent nothing")
    recipients = sum(len(params.get(f) or []) for f in ("to", "cc", "bcc"))
    return {"message_id": mid, "recipients": recipients}
