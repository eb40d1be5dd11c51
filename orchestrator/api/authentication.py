"""The API's token authentication, its one read compiled.

Every API request reads its token and the token's user. Building that query through the ORM
(a queryset, its compiler) cost more than the database spent answering it, so the read is
compiled once per connection (`orchestrator.compiled`); what is read and what is refused are
DRF's `TokenAuthentication`'s.
"""
from django.utils.translation import gettext_lazy as _
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication
from rest_framework.authtoken.models import Token

from ..compiled import CompiledRead

_TOKEN = CompiledRead(lambda key: Token.objects.select_related("user").filter(key=key), "")


class CompiledTokenAuthentication(TokenAuthentication):
    """`Authorization: Token <key>`, as DRF reads it."""

    def authenticate_credentials(self, key: str):
        found = _TOKEN.rows(key)
        if not found:
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        token = found[0]
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        return token.user, token
