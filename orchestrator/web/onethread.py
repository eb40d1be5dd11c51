"""The last middleware: under ASGI, it makes Django run the whole middleware chain in the
request's one thread.

Django runs a middleware that can be async (all of its own) on the event loop when the one
inside it is async, and such a middleware then hands its `process_request` and
`process_response` each to the request's thread (`MiddlewareMixin.__acall__`): two crossings
between the loop and the thread per middleware and request, each waiting for the other side
to be free. A middleware that is sync only, innermost, has every one around it run sync
(docs.djangoproject.com, "Asynchronous support"), so a request crosses to its thread once.
"""


class OneThreadPerRequest:
    sync_capable = True
    async_capable = False

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)
