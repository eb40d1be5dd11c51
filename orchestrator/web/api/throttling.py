"""The rate of run starts per person and per token: DRF throttles on the shared cache.

Applied to every request that starts a run for a person — `POST /api/v1/workflows/<name>/runs/`
(which the builder's Run calls too) and `POST /api/v1/triggers/<id>/fire/` — each counted per
person (`run_start.person`) and, for a request with an API token, per token
(`run_start.token`), at the rates of STEPWISE_RUN_START_RATES ("120/min"; null: none). History
lives in Django's cache — Redis when REDIS_URL is set, the embedded file cache otherwise — so
every web process counts the same starts. A refusal is 429 with `Retry-After` and the one error
shape; it is audited once per person or token and window (`services.admission`), never once per
request. A schedule, a webhook and a queue event are rated per trigger (`max_per_minute`).
While the cache cannot be reached the rate is not counted (a warning is logged): a run lives in
the database, and an outage of Redis must not stop runs from starting.
"""
import hashlib
import logging

import redis
from django.conf import settings
from rest_framework.authtoken.models import Token
from rest_framework.exceptions import Throttled
from rest_framework.throttling import SimpleRateThrottle

from orchestrator.engine.clock import now
from orchestrator.engine.services.admission import identity_of, start_refusal_record

logger = logging.getLogger(__name__)


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
        try:
            return super().allow_request(request, view)
        except (redis.RedisError, OSError) as error:
            logger.warning("run starts are not rate-limited while the cache is unreachable: %s",
                           error)
            return True

    def subject(self, request) -> tuple[str, str] | None:
        """(the ledger's name of whom this counts, the cache's), or None: not counted."""
        raise NotImplementedError

    def get_cache_key(self, request, view) -> str | None:
        found = self.subject(request)
        if found is None:
            return None
        self.named, self.identity = found
        return f"throttle:{self.scope}:{self.identity}"


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
