"""Request body parsers: bounded in size, strict JSON, and workflow definitions as YAML text.

Owns reading request bodies. Every parser refuses a body larger than
`settings.STEPWISE_MAX_REQUEST_BYTES` with 413 before reading it (from Content-Length, and
by reading at most one byte past the limit), and reports an unreadable body as 400; both in
the one error shape `{"errors": [{"path", "message"}]}`. JSON is parsed strictly (no NaN or
Infinity, no duplicate keys, no nesting that overflows the decoder) by the same function
that parses definition text. It must not validate what it parsed; `workflow_save`,
`definition_problems` and `run_start` do that.
"""
from django.conf import settings
from rest_framework import status
from rest_framework.exceptions import APIException
from rest_framework.parsers import BaseParser, FormParser, MultiPartParser

from orchestrator.engine.definitions import DefinitionInvalid, parse_definition_text
from orchestrator.engine.definitions.loader import parse_json_text

from .errors import DefinitionParseError, error_body


class RequestBodyTooLarge(APIException):
    """413: the body is larger than STEPWISE_MAX_REQUEST_BYTES."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE

    def __init__(self, limit: int):
        super().__init__(detail=error_body(
            f"the request body is larger than {limit:,} bytes (STEPWISE_MAX_REQUEST_BYTES)"))


def _check_declared_length(parser_context) -> int:
    limit = settings.STEPWISE_MAX_REQUEST_BYTES
    request = (parser_context or {}).get("request")
    declared = request.META.get("CONTENT_LENGTH") if request is not None else None
    try:
        too_large = declared is not None and int(declared) > limit
    except (TypeError, ValueError):
        too_large = False
    if too_large:
        raise RequestBodyTooLarge(limit)
    return limit


def read_body(stream, parser_context) -> bytes:
    """The body, at most STEPWISE_MAX_REQUEST_BYTES of it. Raises RequestBodyTooLarge."""
    limit = _check_declared_length(parser_context)
    data = stream.read(limit + 1) if stream is not None else b""
    if len(data) > limit:
        raise RequestBodyTooLarge(limit)
    return data


class JSONBodyParser(BaseParser):
    """JSON (`Content-Type: application/json`), bounded and strict."""

    media_type = "application/json"

    def parse(self, stream, media_type=None, parser_context=None) -> object:
        try:
            return parse_json_text(read_body(stream, parser_context), what="JSON")
        except DefinitionInvalid as exc:
            raise DefinitionParseError(exc.problems) from None


class YAMLParser(BaseParser):
    """A definition as YAML text (`Content-Type: application/yaml`)."""

    media_type = "application/yaml"

    def parse(self, stream, media_type=None, parser_context=None) -> dict:
        try:
            return parse_definition_text(read_body(stream, parser_context), content_type=media_type)
        except DefinitionInvalid as exc:
            raise DefinitionParseError(exc.problems) from None


class TextYAMLParser(YAMLParser):
    """The same, for clients that say `Content-Type: text/yaml`."""

    media_type = "text/yaml"


class FormBodyParser(FormParser):
    """DRF's form parser, refusing a body over the limit before reading it."""

    def parse(self, stream, media_type=None, parser_context=None):
        _check_declared_length(parser_context)
        return super().parse(stream, media_type, parser_context)


class MultiPartBodyParser(MultiPartParser):
    """DRF's multipart parser, refusing a body over the limit before reading it."""

    def parse(self, stream, media_type=None, parser_context=None):
        _check_declared_length(parser_context)
        return super().parse(stream, media_type, parser_context)
