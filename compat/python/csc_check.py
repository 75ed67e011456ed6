"""redis-py client-side caching (`protocol=3`, `cache_config`) kept coherent.

redis-py 8 caches read replies in the process and drops them on the
server's RESP3 invalidation pushes (CLIENT TRACKING ON, default mode). It
refuses to do so below Redis 7.4, so ../run.sh runs these checks against
Redis >= 7.4. COMPAT_REDIS_PORT is the Redis behind the endpoint under test:
the "other writer" writes there directly, not through sidecache.
"""

import os
import time

import redis
from redis.cache import CacheConfig

from common import HOST, PORT, PREFIX, expect, main

REDIS_PORT = int(os.environ.get("COMPAT_REDIS_PORT", PORT))
BOUND = 1.0  # seconds: the bound for a direct write to be seen


def cached_client():
    return redis.Redis(host=HOST, port=PORT, protocol=3, cache_config=CacheConfig(), socket_timeout=10)


def cached(r, *command):
    """Whether redis-py holds a reply for this command in its cache."""
    from redis.cache import CacheKey

    return r.get_cache().get(CacheKey(command=command[0], redis_keys=(command[1],), redis_args=command)) is not None


def seen_within(read, wanted):
    """Polls `read` until it returns `wanted`; returns the seconds it took."""
    t0 = time.monotonic()
    while True:
        got = read()
        took = time.monotonic() - t0
        if got == wanted:
            return took
        if took > BOUND:
            raise AssertionError(f"still {got!r} {took:.3f}s after the write, wanted {wanted!r}")
        time.sleep(0.001)


def other_writer():
    """Writes made by another application: to Redis itself, not the endpoint under test."""
    r = redis.Redis(host=HOST, port=REDIS_PORT, socket_timeout=10)
    if r.info("server")["redis_version"] < "7.4":
        raise AssertionError("redis-py client-side caching needs Redis >= 7.4")
    return r


def get():
    r, w = cached_client(), other_writer()
    k = f"{PREFIX}:s"
    w.set(k, "v1")
    expect(r.get(k), b"v1", "first GET")
    expect(r.get(k), b"v1", "second GET")
    expect(cached(r, "GET", k), True, "GET reply held client-side")
    w.set(k, "v2")
    took = seen_within(lambda: r.get(k), b"v2")
    # The client's own write through the endpoint: read back at once.
    r.set(k, "v3")
    expect(r.get(k), b"v3", "GET after the client's own SET")
    # sidecache writes SETs behind: a direct write races the queued SET
    # until it has landed (docs/write-behind.md), so wait for it first.
    seen_within(lambda: w.get(k), b"v3")
    w.delete(k)
    took_del = seen_within(lambda: r.get(k), None)
    return f"GET cached client-side; another writer's SET seen after {took * 1000:.1f} ms, DEL after {took_del * 1000:.1f} ms; own SET read back"


def hash_():
    r, w = cached_client(), other_writer()
    k = f"{PREFIX}:h"
    w.hset(k, mapping={"a": "1", "b": "2"})
    expect(r.hgetall(k), {b"a": b"1", b"b": b"2"}, "first HGETALL")
    expect(r.hget(k, "a"), b"1", "first HGET")
    expect(r.hgetall(k), {b"a": b"1", b"b": b"2"}, "second HGETALL")
    expect(cached(r, "HGETALL", k), True, "HGETALL reply held client-side")
    w.hset(k, "a", "10")
    took = seen_within(lambda: r.hgetall(k), {b"a": b"10", b"b": b"2"})
    expect(r.hget(k, "a"), b"10", "HGET after another writer's HSET")
    r.hdel(k, "b")
    expect(r.hgetall(k), {b"a": b"10"}, "HGETALL after the client's own HDEL")
    return f"HGETALL and HGET cached client-side; another writer's HSET seen after {took * 1000:.1f} ms; own HDEL read back"


def expiry():
    r, w = cached_client(), other_writer()
    k = f"{PREFIX}:e"
    w.set(k, "v", px=300)
    expect(r.get(k), b"v", "GET before the expiry")
    expect(cached(r, "GET", k), True, "GET reply held client-side")
    time.sleep(0.3)
    took = seen_within(lambda: r.get(k), None)
    return f"a key that expired in Redis is gone client-side {took * 1000:.1f} ms after its TTL"


if __name__ == "__main__":
    main({"get": get, "hash": hash_, "expiry": expiry})
