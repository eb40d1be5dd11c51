"""How much work waits in each broker queue, and for how long: the one reading of queue depth.

Reads only (the selectors layer); the operations page shows it and a metrics endpoint may
export it. Both brokers are read directly, never through Celery's inspect (which asks the
workers and so says nothing when none is running):

* the embedded broker (`stepwisefs://`): one file per message in the queue folder, named
  `<n>_<uuid>.<queue>.msg`; the oldest message's age is its file's age;
* Redis: one list per queue (Kombu pushes at the head and pops at the tail), so the depth is
  `LLEN`; a Kombu message carries no sending time, so its age is read from the `sent_at`
  header when the sender set one and is otherwise unknown (None), never guessed.
"""
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from orchestrator.engine.capacity import added_class_names

# The queues the engine sends to (dispatch.queue_for, dispatch.batch_queue_for): orchestrator,
# tools and agent.<model> for each configured model, the last two with a `.batch` side, and
# each with an `.evaluation` side, where every step and item of an evaluation run goes
# (engine/states.py: RunCapacity).
BATCH_SUFFIX = ".batch"
EVALUATION_SUFFIX = ".evaluation"


@dataclass(frozen=True)
class QueueDepth:
    name: str
    depth: int
    oldest_age_s: float | None  # None when empty, or when the broker cannot say


def known_queues() -> list[str]:
    """Every queue, each interactive one followed by its batch side (map items and batch runs),
    then the evaluation side of each family, then the side of each class an operator added."""
    models = sorted({f"agent.{name}" for name in getattr(settings, "STEPWISE_MODELS", {})})
    families = ("orchestrator", "tools", *models)
    return ["orchestrator",
            *(name for queue in ("tools", *models) for name in (queue, queue + BATCH_SUFFIX)),
            *(queue + EVALUATION_SUFFIX for queue in families),
            *(f"{queue}.{name}" for name in added_class_names() for queue in families)]


def capacity_of_queue(name: str) -> str:
    """The capacity class a queue serves: `evaluation`, `batch` (map items and batch runs), a
    class an operator added, or `interactive`."""
    if name.endswith(EVALUATION_SUFFIX):
        return "evaluation"
    if name.endswith(BATCH_SUFFIX):
        return "batch"
    suffix = name.rsplit(".", 1)[-1]
    return suffix if "." in name and suffix in added_class_names() else "interactive"


def queue_depths(queues: list[str] | None = None) -> list[QueueDepth]:
    """Depth and oldest-message age of each queue, on whichever broker is configured.

    Raises nothing for an unreachable broker: the caller shows the error it gets back from
    `broker_error`; here an unreachable Redis gives an empty list.
    """
    queues = queues or known_queues()
    url = settings.CELERY_BROKER_URL
    if url.startswith(("stepwisefs://", "filesystem://")):
        return _filesystem_depths(queues)
    if url.startswith(("redis://", "rediss://")):
        return _redis_depths(url, queues)
    return []


def _filesystem_depths(queues: list[str]) -> list[QueueDepth]:
    folder = Path(settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_out"])
    found: dict[str, list[float]] = {queue: [] for queue in queues}
    now = time.time()
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        entries = []
    for entry in entries:
        if not entry.name.endswith(".msg"):
            continue
        queue = entry.name[:-len(".msg")].split(".", 1)[-1]
        try:
            found.setdefault(queue, []).append(entry.stat().st_mtime)
        except FileNotFoundError:  # consumed while we looked
            continue
    return [QueueDepth(name, len(times), round(now - min(times), 3) if times else None)
            for name, times in sorted(found.items())]


def _redis_depths(url: str, queues: list[str]) -> list[QueueDepth]:
    import redis  # the production broker's client, installed with the server

    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    now = time.time()
    depths = []
    try:
        for queue in queues:
            depth = client.llen(queue)
            age = None
            if depth:
                oldest = client.lindex(queue, -1)
                sent_at = _sent_at(oldest)
                age = round(now - sent_at, 3) if sent_at else None
            depths.append(QueueDepth(queue, depth, age))
    except redis.RedisError:
        return []
    finally:
        client.close()
    return depths


def _sent_at(raw: bytes | None) -> float | None:
    try:
        headers = json.loads(raw or b"{}").get("headers") or {}
        return float(headers["sent_at"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
