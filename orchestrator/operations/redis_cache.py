"""Django's Redis cache, with one client per connection pool instead of one per call.

Django's `RedisCacheClient.get_client` builds a new `redis.Redis` for every cache operation,
and building one registers its ~180 response callbacks: on a worker that reads a circuit
breaker before every step (`orchestrator.engine.limits`), that was more CPU than the round trip to
Redis. A `redis.Redis` is safe to share between threads (each command takes a connection from
the pool), and its pool starts afresh in a forked child, so one per pool is enough.

It must not change what the cache stores or how: keys, serialization and pools are Django's.
"""
from django.core.cache.backends.redis import RedisCache, RedisCacheClient


class _ClientPerPool(RedisCacheClient):
    def get_client(self, key=None, *, write=False):
        pool = self._get_connection_pool(write)
        clients = self.__dict__.setdefault("_clients", {})
        client = clients.get(id(pool))
        if client is None:
            client = clients[id(pool)] = self._client(connection_pool=pool)
        return client


class SharedClientRedisCache(RedisCache):
    def __init__(self, server, params):
        super().__init__(server, params)
        self._class = _ClientPerPool
