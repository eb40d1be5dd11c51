"""The API's token authentication.

Every API request reads its token and the token's user (`selectors.token_with_user`, a read
of the store's); what is read and what is refused are DRF's `TokenAuthentication`'s.

The token is sent as `Authorization: Bearer <key>` (what OpenAPI tools, Swagger's "Authorize"
included, send for an HTTP bearer scheme) or `Authorization: Token <key>` (DRF's own scheme,
which the Python client and older scripts send). Any other Authorization header is refused
with a 401 that names both schemes, and every 401 says them in its WWW-Authenticate header.
"""
from django.utils.translation import gettext_lazy as _
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication, get_authorization_header

from orchestrator.engine.selectors import token_with_user

#: The schemes an Authorization header may use, in the order the 401 names them.
SCHEMES = ("Bearer", "Token")
HOW = "send your API token as 'Authorization: Bearer <key>' (or 'Authorization: Token <key>')"


class CompiledTokenAuthentication(TokenAuthentication):
    """`Authorization: Bearer <key>` or `Authorization: Token <key>`."""

    # What the published schema declares (drf-spectacular makes it an HTTP bearer scheme, so
    # Swagger's "Authorize" takes the bare key).
    keyword = "Bearer"

    def authenticate(self, request):
        header = get_authorization_header(request).split()
        if not header:
            return None
        scheme = header[0].decode("latin-1")
        if scheme.lower() not in {s.lower() for s in SCHEMES}:
            if len(header) == 1:
                raise exceptions.AuthenticationFailed(
                    f"The Authorization header has a key but no scheme: {HOW}.")
            raise exceptions.AuthenticationFailed(
                f"The Authorization scheme '{scheme[:20]}' is not accepted: {HOW}.")
        if len(header) != 2:
            raise exceptions.AuthenticationFailed(
                f"The Authorization header must be a scheme and one key: {HOW}.")
        try:
            key = header[1].decode()
        except UnicodeError:
            raise exceptions.AuthenticationFailed(_("Invalid token header. Token string should "
                                                    "not contain invalid characters.")) from None
        return self.authenticate_credentials(key)

    def authenticate_header(self, request) -> str:
        return ", ".join(f'{scheme} realm="api"' for scheme in SCHEMES)

    def authenticate_credentials(self, key: str):
        token = token_with_user(key)
        if token is None:
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        return token.user, token
