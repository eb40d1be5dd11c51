"""The API's JSON renderer: DRF's, except that a response never fails on stored text that is
not valid Unicode (a lone surrogate kept from before entries refused it): such text is sent
with U+FFFD in its place (`orchestrator.engine.text.replaced`) instead of answering 500."""
from rest_framework.renderers import JSONRenderer

from orchestrator.engine.text import replaced


class JSONBodyRenderer(JSONRenderer):
    def render(self, data, accepted_media_type=None, renderer_context=None):
        try:
            return super().render(data, accepted_media_type, renderer_context)
        except UnicodeEncodeError:
            return super().render(replaced(data), accepted_media_type, renderer_context)
