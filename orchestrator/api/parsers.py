"""Request body parsers: workflow definitions sent as YAML text.

Owns turning a YAML body into a dict with `parse_definition_text`. It must not validate the
definition; `workflow_save` and `definition_problems` do that.
"""
from rest_framework.parsers import BaseParser

from ..definitions import DefinitionInvalid, parse_definition_text
from .errors import DefinitionParseError


class YAMLParser(BaseParser):
    """A definition as YAML text (`Content-Type: application/yaml`)."""

    media_type = "application/yaml"

    def parse(self, stream, media_type=None, parser_context=None) -> dict:
        try:
            return parse_definition_text(stream.read(), content_type=media_type)
        except DefinitionInvalid as exc:
            raise DefinitionParseError(exc.problems) from None


class TextYAMLParser(YAMLParser):
    """The same, for clients that say `Content-Type: text/yaml`."""

    media_type = "text/yaml"
