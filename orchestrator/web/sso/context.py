from django.conf import settings


def sso(request) -> dict:
    """`sso_provider`: the name the login page's "Sign in with ..." button shows, when on."""
    return {"sso_provider": settings.STEPWISE_OIDC_PROVIDER_NAME
            if settings.STEPWISE_OIDC_ENABLED else ""}
