"""The rate of run starts per person and per token: DRF throttles on the shared cache.

Applied to every request that starts a run for a person — `POST /api/v1/workflows/<name>/runs/`
(which the builder's Run calls too) and `POST /api/v1/triggers/<id>/fire/` — each counted per
person (`run_start.person`) and, for a request with an API token, per token
(`run_start.token`), at the rates of STEPWISE_RUN_START_RATES ("120/min"; null: none): a sliding
window, as DRF's `SimpleRateThrottle` counts. History lives in Django's cache — Redis when
REDIS_URL is set, the embedded file cache otherwise — so every web process counts the same
starts, and each start is counted atomically: on Redis one script reads, counts and adds it
(`_WINDOW`), on the file cache the read and the write hold a lock every process shares. Requests
sent at once therefore never all read the same history and all pass (DRF's own read, append and
`cache.set` let them). A refusal is 429 with `Retry-After` and the one error shape; it is audited
once per person or token and window (`services.admission`), never once per request. A schedule,
a webhook and a queue event are rated per trigger (`max_per_minute`).
While the cache cannot be reached the rate is not counted (a warning is logged): a run lives in
the database, and an outage of Redis must not stop runs from starting.
"""
import fcntl
import hashlib
import logging
import os
import threading
import uuid
from contextlib import contextmanager

import redis
from django.conf import settings
from django.core.cache import DEFAULT_CACHE_ALIAS, caches
from django.core.cache.backends.base import BaseCache
from django.core.cache.backends.filebased import FileBasedCache
from django.core.cache.backends.redis import RedisCache
from rest_framework.authtoken.models import Token
from rest_framework.exceptions import Throttled
from rest_framework.throttling import SimpleRateThrottle

from orchestrator.engine.clock import now
from orchestrator.engine.services.admission import identity_of, start_refusal_record

logger = logging.getLogger(__name__)

#: On Redis, a window is a sorted set of its starts scored by their time. One call forgets the
#: starts that left the window, counts the rest, adds this one if the rate allows it, and answers
#: (added, starts in the window, the oldest one's time). Times go in and out as strings, never
#: through Lua's numbers, which would round them.
_WINDOW = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
local counted = redis.call('ZCARD', KEYS[1])
local added = 0
if counted < tonumber(ARGV[3]) then
    redis.call('ZADD', KEYS[1], ARGV[1], ARGV[5])
    redis.call('EXPIRE', KEYS[1], ARGV[4])
    counted, added = counted + 1, 1
end
return {added, counted, redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]}
"""
#: The file cache's lock, in its own directory: every process that shares the cache shares it,
#: and Django's file cache neither culls nor clears a file not named `*.djcache`.
_FILE_LOCK = "run-starts.lock"
#: A cache in this process's memory (LocMemCache, in tests) is shared by its threads only.
_PROCESS_LOCK = threading.Lock()


class _RunStartThrottle(SimpleRateThrottle):
    scope = ""

    def timer(self) -> float:
        return now().timestamp()  # the engine's one clock (orchestrator.engine.clock)

    def __init__(self):
        # The rate is read per request, so a changed setting applies at once (DRF reads its
        # own THROTTLE_RATES once, at import).
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)

    def get_rate(self) -> str | None:
        return settings.STEPWISE_RUN_START_RATES.get(self.scope)

    def allow_request(self, request, view) -> bool:
        """DRF's sliding window, with the history read, counted and written back as one step."""
        if self.rate is None:
            return True
        self.key = self.get_cache_key(request, view)
        if self.key is None:
            return True
        self.now = self.timer()
        try:
            allowed, self.counted, self.oldest = _window_admit(
                self.key, moment=self.now, window_s=self.duration, limit=self.num_requests)
        except (redis.RedisError, OSError) as error:
            logger.warning("run starts are not rate-limited while the cache is unreachable: %s",
                           error)
            return True
        return allowed

    def wait(self) -> float | None:
        """Retry-After, as DRF's: what is left of the oldest start's window, shared among the
        starts the window still allows (None: none does)."""
        available = self.num_requests - self.counted + 1
        if available <= 0:
            return None
        return (self.duration - (self.now - self.oldest)) / available

    def subject(self, request) -> tuple[str, str] | None:
        """(the ledger's name of whom this counts, the cache's), or None: not counted."""
        raise NotImplementedError

    def get_cache_key(self, request, view) -> str | None:
        found = self.subject(request)
        if found is None:
            return None
        self.named, self.identity = found
        # Not DRF's `throttle:` key: on Redis the window is a sorted set, not a pickled list.
        return f"run_starts:{self.scope}:{self.identity}"


def _window_admit(key: str, *, moment: float, window_s: int,
                  limit: int) -> tuple[bool, int, float]:
    """Count a start at `moment` in `key`'s window of the last `window_s` seconds, unless
    `limit` starts are in it already, in the default cache (DRF's throttles' own). Returns
    (counted, the starts in the window with it, the oldest one's time — `moment` when there is
    none). Raises redis.RedisError or OSError when the cache cannot be reached."""
    cache = caches[DEFAULT_CACHE_ALIAS]
    if isinstance(cache, RedisCache):
        full_key = cache.make_and_validate_key(key)
        # Django's Redis cache has no public client; tests/engine/test_redis_cache.py reads it
        # the same way, so an upgrade that moves it fails there too.
        client = cache._cache.get_client(full_key, write=True)
        # Each start its own member: starts at the same moment are counted apart.
        reply = client.register_script(_WINDOW)(
            keys=[full_key], args=[moment, moment - window_s, limit, window_s, uuid.uuid4().hex])
        return bool(reply[0]), reply[1], float(reply[2]) if len(reply) > 2 else moment
    with _exclusive(cache):
        # DRF's history: the starts' times, newest first.
        history = [start for start in cache.get(key, []) if start > moment - window_s]
        allowed = len(history) < limit
        if allowed:
            history.insert(0, moment)
            cache.set(key, history, window_s)
        return allowed, len(history), min(history, default=moment)


@contextmanager
def _exclusive(cache: BaseCache):
    """Hold the lock every process sharing the default cache, `cache`, takes to read and write
    a window."""
    if not isinstance(cache, FileBasedCache):
        with _PROCESS_LOCK:
            yield
        return
    folder = settings.CACHES[DEFAULT_CACHE_ALIAS]["LOCATION"]
    os.makedirs(folder, 0o700, exist_ok=True)  # private, as Django's file cache makes it
    fd = os.open(os.path.join(folder, _FILE_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        # A lock of its own open file: it excludes other threads of this process too.
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


class PersonRunStartThrottle(_RunStartThrottle):
    scope = "run_start.person"

    def subject(self, request):
        user = request.user
        if not user or not user.is_authenticated:
            return None
        return f"user:{user.get_username()}", identity_of(user)


class TokenRunStartThrottle(_RunStartThrottle):
    scope = "run_start.token"

    def subject(self, request):
        if not isinstance(request.auth, Token):
            return None
        # Never the token itself: a digest names it in the cache and the ledger.
        digest = hashlib.sha256(request.auth.key.encode()).hexdigest()[:16]
        return f"token:{digest}", f"token:{digest}"


RUN_START_THROTTLES = [PersonRunStartThrottle, TokenRunStartThrottle]


class RunStartThrottled(Throttled):
    default_detail = "too many run starts"


class RunStartThrottleMixin:
    """For a view whose actions start runs: a refusal by `RUN_START_THROTTLES` is answered with
    which limit refused, and audited once per window."""

    def check_throttles(self, request):
        refused = [throttle for throttle in self.get_throttles()
                   if not throttle.allow_request(request, self)]
        if not refused:
            return
        if not all(isinstance(throttle, _RunStartThrottle) for throttle in refused):
            return super().check_throttles(request)
        throttle = max(refused, key=lambda t: t.wait() or 0)
        wait = max(1, round(throttle.wait() or 1))
        who = "this person" if throttle.scope == "run_start.person" else "this API token"
        message = (f"{who} started {throttle.num_requests} runs in the last "
                   f"{throttle.duration} seconds, the most allowed (STEPWISE_RUN_START_RATES "
                   f"{throttle.scope} {throttle.rate})")
        problems = [{"path": "", "message": message}]
        start_refusal_record(limit=throttle.scope, actor=request.user, team="",
                             path=self.start_path(request), problems=problems,
                             retry_after_s=wait, subject=throttle.named,
                             identity=f"{throttle.scope}:{throttle.identity}")
        raise RunStartThrottled(wait=wait, detail=message)

    def start_path(self, request) -> str:
        return "api"
