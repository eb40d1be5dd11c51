"""The websocket routes (mounted by orchestrator/asgi.py)."""
from django.urls import path

from .consumers import RunConsumer, RunListConsumer

websocket_urlpatterns = [
    path("ws/runs/", RunListConsumer.as_asgi()),
    path("ws/runs/<uuid:run_id>/", RunConsumer.as_asgi()),
]
