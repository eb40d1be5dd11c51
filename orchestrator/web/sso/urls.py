from django.urls import path

from . import views

urlpatterns = [
    path("authenticate/", views.SignInView.as_view(), name="sso-sign-in"),
    # mozilla-django-oidc's name: the backend reverses it for the redirect URI.
    path("callback/", views.CallbackView.as_view(), name="oidc_authentication_callback"),
    path("refused/", views.refused, name="sso-refused"),
]
