"""The request middleware of logs and traces: every line a request logs carries its trace id
(and the run's id when the URL names a run), and the request is a span when tracing is on.

The trace continues an incoming W3C `traceparent`; the response names it in `X-Trace-Id`, so
a caller can find its request's log lines and spans.
"""
from django.urls import Resolver404, resolve
from django.utils.log import log_response
from opentelemetry.trace import SpanKind

from orchestrator.operations import tracing
from orchestrator.operations.logcontext import bind, current


class RequestContextMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        headers = {"traceparent": request.headers.get("traceparent", "")}
        with tracing.continued(f"{request.method} {_route(request)}", headers,
                               kind=SpanKind.SERVER, method=request.method, path=request.path):
            response = self.get_response(request)
            response["X-Trace-Id"] = current().get("trace_id", "")
            if response.status_code >= 400:
                # Django's own line for a 4xx/5xx, written here so it carries the request's
                # ids; Django sees it was logged and does not write it again.
                log_response("%s: %s", response.reason_phrase, request.path,
                             response=response, request=request)
            return response

    def process_view(self, request, view_func, view_args, view_kwargs):
        """A URL that names a run puts its id on the request's lines (undone with the trace's
        binding when the request ends)."""
        run_id = view_kwargs.get("run_id") or (
            view_kwargs.get("pk") if "/runs/" in request.path else None)
        if run_id:
            bind(run_id=run_id)


def _route(request) -> str:
    """The span's name: the URL's name (api:run-detail), never the path with its ids."""
    try:
        return resolve(request.path_info).view_name
    except Resolver404:
        return "unrouted"
