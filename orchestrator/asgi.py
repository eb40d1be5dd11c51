"""ASGI entry point: Django for HTTP, Channels for the live pages' websockets (docs/live.md).

Websockets are authenticated by the Django session (the admin's sign-in), and only from this
site's origins (`ALLOWED_HOSTS`); each consumer then checks who may watch what (`authz`).
"""
import os

from django.conf import settings
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator.settings")
if not settings.configured:
    # The web server takes its PostgreSQL connections from a pool (settings.py; the variable is
    # its size, 0 turns it off). Only where this module is the entry point (uvicorn's processes):
    # a process whose settings were read before it imported this module keeps them, and nothing
    # it starts later inherits the variable.
    os.environ.setdefault("STEPWISE_DB_POOL", "16")
    # Without the pool, no persistent connections: each request's thread would keep its own
    # open after the request, until PostgreSQL refused new clients ("too many clients").
    os.environ.setdefault("STEPWISE_DB_CONN_MAX_AGE_S", "0")
django_asgi = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from orchestrator.live.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter({
    "http": django_asgi,
    "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
})
