"""The sign-in views: mozilla-django-oidc's, answering 404 while single sign-on is off, and the
page that says why a sign-in was refused."""
from django.conf import settings
from django.contrib import admin
from django.http import Http404
from django.shortcuts import render
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from .backends import REFUSED


class _WhenEnabled:
    def __init__(self, *args, **kwargs):
        # mozilla-django-oidc reads its settings here and fails without them.
        if settings.STEPWISE_OIDC_ENABLED:
            super().__init__(*args, **kwargs)

    def dispatch(self, request, *args, **kwargs):
        if not settings.STEPWISE_OIDC_ENABLED:
            raise Http404("single sign-on is not configured")
        return super().dispatch(request, *args, **kwargs)


class SignInView(_WhenEnabled, OIDCAuthenticationRequestView):
    pass


class CallbackView(_WhenEnabled, OIDCAuthenticationCallbackView):
    pass


def refused(request):
    reason = request.session.pop(REFUSED, "") or (
        "The identity provider did not sign you in, or the sign-in could not be checked.")
    return render(request, "admin/sso_refused.html", {
        **admin.site.each_context(request), "title": "Sign-in refused", "reason": reason,
        "provider": settings.STEPWISE_OIDC_PROVIDER_NAME}, status=403)
