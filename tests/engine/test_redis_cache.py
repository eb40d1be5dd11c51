"""The Redis cache the engine's shared limits live in keeps one client per connection pool, and
still stores, counts and forgets as Django's does."""
import pytest
import redis

from orchestrator.operations.redis_cache import SharedClientRedisCache
from tests.support.integrations import REDIS_URL, need, unique


@pytest.fixture
def cache():
    need("Redis")
    prefix = unique("cache")
    backend = SharedClientRedisCache(REDIS_URL, {"KEY_PREFIX": prefix})
    yield backend
    server = redis.Redis.from_url(REDIS_URL)
    for key in server.scan_iter(f"{prefix}:*"):
        server.delete(key)


def test_every_operation_uses_the_same_client(cache):
    first = cache._cache.get_client(write=True)
    cache.set("a", 1)
    cache.get_many(["a", "b"])
    assert cache._cache.get_client() is first
    assert cache._cache.get_client(write=True) is first


def test_it_stores_counts_and_forgets_as_djangos_redis_cache(cache):
    assert cache.get_many(["until", "failures"]) == {}
    assert cache.add("failures", 0, timeout=60)
    assert not cache.add("failures", 5, timeout=60)
    assert cache.incr("failures") == 1
    cache.set("until", 12.5, timeout=60)
    assert cache.get_many(["until", "failures"]) == {"until": 12.5, "failures": 1}
    cache.delete_many(["until", "failures"])
    assert cache.get("until") is None
