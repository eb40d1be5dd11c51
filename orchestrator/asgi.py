"""ASGI entry point: Django for HTTP, Channels for the live pages' websockets (docs/live.md).

Websockets are authenticated by the Django session (the admin's sign-in), and only from this
site's origins (`ALLOWED_HOSTS`); each consumer then checks who may watch what (`authz`).
Every HTTP request body is bounded before Django reads it (`BodyLimit`).
"""
import gc
import json
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

from orchestrator.web.api.errors import error_body  # noqa: E402
from orchestrator.web.live.routing import websocket_urlpatterns  # noqa: E402


class BodyLimit:
    """Refuse a request body larger than `STEPWISE_MAX_REQUEST_BYTES` with 413 before it is
    read: a declared Content-Length is checked first; a body without one (chunked) is counted
    as it arrives, and once past the limit nothing more is read. Django's handler would spool
    the whole body before any view, even an anonymous one answering 404."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = settings.STEPWISE_MAX_REQUEST_BYTES
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await _too_large(send, limit)
        received, over, started = 0, False, False

        async def counted():
            nonlocal received, over
            if over:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    over = True  # Django stops reading at a disconnect and answers nothing
                    return {"type": "http.disconnect"}
            return message

        async def watched(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, counted, watched)
        if over and not started:
            await _too_large(send, limit)


async def _too_large(send, limit: int) -> None:
    body = json.dumps(error_body(f"the request body is larger than {limit:,} bytes "
                                 "(STEPWISE_MAX_REQUEST_BYTES)")).encode()
    await send({"type": "http.response.start", "status": 413, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


application = ProtocolTypeRouter({
    "http": BodyLimit(django_asgi),
    "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
})

# What is loaded by now lives as long as the process. Frozen, it is left out of the collector's
# full passes, which would otherwise walk it all in the middle of some request.
gc.freeze()
# A request leaves cycles behind (its thread's connection object, cursors, serializer fields).
# Young passes every 700 allocations promoted them while their request still ran, to pile up
# for full passes that stopped every request at once; every 20,000, most are freed young
# (docs/benchmark.md, "The API under load").
gc.set_threshold(20_000, *gc.get_threshold()[1:])
