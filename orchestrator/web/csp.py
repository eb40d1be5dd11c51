"""The Content-Security-Policy header on every response (docs/security.md#content-security-policy).

Scripts come only from this server's own files: no inline script, no `eval`, no other host, so
an injected `<script>` or `on*=` attribute does not run. Styles allow inline ones (Django's admin
templates and the bundled Swagger UI and ReDoc set them). The policy is `STEPWISE_CSP`; a
response that sets its own keeps it (`allowing`: one view's exception, said where it is made).
"""
from functools import wraps

from django.conf import settings


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        policy = settings.STEPWISE_CSP
        if policy and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = policy
        return response


def allowing(view, directive: str, source: str):
    """`view` answered under the policy with `source` added to `directive` (for that view only)."""

    @wraps(view)
    def wrapped(request, *args, **kwargs):
        response = view(request, *args, **kwargs)
        parts = [part.strip() for part in settings.STEPWISE_CSP.split(";") if part.strip()]
        response["Content-Security-Policy"] = "; ".join(
            f"{part} {source}" if part.split(" ", 1)[0] == directive else part for part in parts)
        return response

    return wrapped
