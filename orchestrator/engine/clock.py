"""The one clock. Everything that needs the time calls `now()`; tests may swap `_source`."""
from collections.abc import Callable
from datetime import datetime

from django.utils import timezone

_source: Callable[[], datetime] = timezone.now


def now() -> datetime:
    """Return the current aware datetime."""
    return _source()
