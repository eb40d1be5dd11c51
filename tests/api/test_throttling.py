"""The run-start rate (`orchestrator.web.api.throttling`) holds for starts sent at once.

Each case runs on both caches the settings choose between: the embedded file cache (in a
directory of the test's own) and Redis (`SharedClientRedisCache`, under a key prefix of the
test's own). Starts sent together — threads of one web process, or web processes sharing the
cache — pass exactly as many times as the rate allows, never once per request that read the
same history. The HTTP answer to a refusal is tested in tests/security.
"""
import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from rest_framework.authtoken.models import Token
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from orchestrator.models import Role
from orchestrator.web.api.throttling import PersonRunStartThrottle, TokenRunStartThrottle
from tests.factories import member
from tests.support.integrations import REDIS_URL, need, unique

pytestmark = pytest.mark.django_db

AT_ONCE = 40
PROCESSES = 12


@pytest.fixture(params=["file", "redis"])
def shared_cache(request, settings, tmp_path):
    """The default cache, as the settings make it with and without REDIS_URL."""
    if request.param == "file":
        settings.CACHES = {"default": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(tmp_path / "cache")}}
        yield request.param
        return
    need("Redis")
    prefix = unique("throttle")
    settings.CACHES = {"default": {
        "BACKEND": "orchestrator.operations.redis_cache.SharedClientRedisCache",
        "LOCATION": REDIS_URL, "KEY_PREFIX": prefix}}
    yield request.param
    server = redis.Redis.from_url(REDIS_URL)
    for key in server.scan_iter(f"{prefix}:*"):
        server.delete(key)


@pytest.fixture
def flooder(team):
    return member(team, "flooder", role=Role.MEMBER)


def start_request(person, token: Token | None = None) -> Request:
    """A run start by `person`, with `token` when it came with one."""
    request = Request(APIRequestFactory().post("/api/v1/workflows/gated/runs/"))
    request.user, request.auth = person, token
    return request


def allowed_at_once(throttle_class, request, count: int) -> list[bool]:
    """`count` threads ask `throttle_class` to allow `request`, all released together."""
    together = threading.Barrier(count)

    def start(_):
        together.wait(timeout=30)
        return throttle_class().allow_request(request, None)

    with ThreadPoolExecutor(count) as threads:
        return list(threads.map(start, range(count)))


@pytest.mark.parametrize("throttle_class, scope", [
    (PersonRunStartThrottle, "run_start.person"), (TokenRunStartThrottle, "run_start.token")])
def test_starts_sent_at_once_by_threads_pass_only_as_often_as_the_rate_allows(
        throttle_class, scope, shared_cache, flooder, move_clock, settings):
    settings.STEPWISE_RUN_START_RATES = {scope: "5/min"}
    request = start_request(flooder, Token.objects.create(user=flooder))

    allowed = allowed_at_once(throttle_class, request, AT_ONCE)

    assert allowed.count(True) == 5
    assert not throttle_class().allow_request(request, None)


def test_starts_sent_at_once_by_processes_pass_only_as_often_as_the_rate_allows(
        shared_cache, flooder, move_clock, settings):
    """Web processes sharing the cache, each asking once, all released together."""
    settings.STEPWISE_RUN_START_RATES = {"run_start.person": "5/min"}
    request = start_request(flooder)
    fork = multiprocessing.get_context("fork")
    together, answers = fork.Barrier(PROCESSES), fork.Queue()

    def web_process():
        together.wait(timeout=30)
        answers.put(PersonRunStartThrottle().allow_request(request, None))

    processes = [fork.Process(target=web_process) for _ in range(PROCESSES)]
    for process in processes:
        process.start()
    allowed = [answers.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(timeout=30)

    assert [process.exitcode for process in processes] == [0] * PROCESSES
    assert allowed.count(True) == 5


# (seconds after the first start, allowed, Retry-After when refused) at 3/min: a start leaves
# the window 60 s after it was made, not at the turn of a calendar minute.
SLIDING = [(0, True, None), (20, True, None), (40, True, None),
           (50, False, 10),  # the start at 0 leaves in 10 s
           (60, True, None),  # it left: 20, 40, 60 remain
           (61, False, 19)]  # the start at 20 leaves in 19 s


def test_the_window_slides_and_a_refusal_says_when_the_oldest_start_leaves_it(
        shared_cache, flooder, move_clock, settings):
    settings.STEPWISE_RUN_START_RATES = {"run_start.person": "3/min"}
    request = start_request(flooder)
    seen = []
    for seconds, _, _ in SLIDING:
        move_clock(seconds)
        throttle = PersonRunStartThrottle()
        allowed = throttle.allow_request(request, None)
        seen.append((seconds, allowed, None if allowed else round(throttle.wait(), 3)))

    assert seen == SLIDING


def test_a_person_their_token_and_another_person_are_counted_apart(
        shared_cache, team, flooder, move_clock, settings):
    settings.STEPWISE_RUN_START_RATES = {"run_start.person": "1/min", "run_start.token": "1/min"}
    request = start_request(flooder, Token.objects.create(user=flooder))
    other = start_request(member(team, "other", role=Role.MEMBER))

    assert PersonRunStartThrottle().allow_request(request, None)
    assert TokenRunStartThrottle().allow_request(request, None)
    assert PersonRunStartThrottle().allow_request(other, None)
    assert not PersonRunStartThrottle().allow_request(request, None)
    assert not TokenRunStartThrottle().allow_request(request, None)


def test_a_file_cache_that_cannot_be_written_does_not_stop_run_starts(
        flooder, move_clock, settings, tmp_path, caplog):
    """As with Redis down (tests/security/test_authority_paths.py): not counted, and said."""
    (tmp_path / "not-a-folder").write_text("")
    settings.CACHES = {"default": {
        "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
        "LOCATION": str(tmp_path / "not-a-folder" / "cache")}}
    settings.STEPWISE_RUN_START_RATES = {"run_start.person": "1/min"}
    request = start_request(flooder)

    assert [PersonRunStartThrottle().allow_request(request, None) for _ in range(3)] == [True] * 3
    assert "not rate-limited while the cache is unreachable" in caplog.text
