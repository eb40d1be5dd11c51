"""The REST API of triggers (mounted under /api/v1/ by orchestrator.web.api.urls) and the webhook
receiver. Entry points: they parse, call one service, and answer in the `errors` shape."""
