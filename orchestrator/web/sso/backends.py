"""mozilla-django-oidc's backend for Stepwise: the username from a configured claim, the
groups from another, accounts created only when allowed, and a refusal that says why.

The reason a sign-in was refused is kept in the session for `views.refused` to show.
"""
import logging

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from .mapping import access_for, groups_in, validate
from .services import sso_sign_in

logger = logging.getLogger(__name__)

#: The session key `views.refused` reads the reason of a refused sign-in from.
REFUSED = "sso_refused"


class StepwiseOIDCBackend(OIDCAuthenticationBackend):
    def verify_token(self, token, **kwargs):
        """The ID token's signature and nonce (mozilla-django-oidc), then its issuer, which
        mozilla-django-oidc leaves unchecked, when one is configured.

        Raises SuspiciousOperation (answered 400) when the issuer is another.
        """
        payload = super().verify_token(token, **kwargs)
        issuer = settings.STEPWISE_OIDC_ISSUER
        if issuer and payload.get("iss") != issuer:
            raise SuspiciousOperation(f"ID token issued by {payload.get('iss')!r}, not {issuer!r}")
        return payload

    def get_or_create_user(self, access_token, id_token, payload):
        claims = self.get_userinfo(access_token, id_token, payload)
        username = claims.get(settings.STEPWISE_OIDC_USERNAME_CLAIM)
        if not isinstance(username, str) or not username:
            return self._refuse(f"The identity provider did not send the "
                                f"{settings.STEPWISE_OIDC_USERNAME_CLAIM!r} claim that names "
                                "your Stepwise account.")
        try:
            mapping = validate(settings.STEPWISE_OIDC_GROUPS)
        except ImproperlyConfigured as wrong:
            logger.error("single sign-on refused %s: %s", username, wrong)
            return self._refuse("Single sign-on is not configured correctly here (its group "
                                "mapping); ask an administrator.")
        idp_groups = groups_in(claims, settings.STEPWISE_OIDC_GROUPS_CLAIM)
        access = access_for(idp_groups, mapping)
        if settings.STEPWISE_OIDC_REFUSE_UNMAPPED and not access.known:
            return self._refuse(f"None of your groups at the identity provider "
                                f"({', '.join(idp_groups) or 'none'}) gives access to Stepwise.")
        user = sso_sign_in(username=username, email=claims.get("email") or "",
                           idp_groups=idp_groups, access=access,
                           create=settings.OIDC_CREATE_USER)
        if user is None:
            return self._refuse(f"There is no Stepwise account named {username!r}, and accounts "
                                "are not created at sign-in here.")
        return user

    def _refuse(self, reason: str) -> None:
        self.request.session[REFUSED] = reason
        return None
