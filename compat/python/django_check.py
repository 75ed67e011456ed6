"""Django's built-in cache backend (django.core.cache.backends.redis.RedisCache)."""

import django
from django.conf import settings

from common import PREFIX, URL, expect, main


def cache_ops():
    settings.configure(
        CACHES={
            "default": {
                "BACKEND": "django.core.cache.backends.redis.RedisCache",
                "LOCATION": URL,
                "KEY_PREFIX": PREFIX,
                "TIMEOUT": 300,
            }
        }
    )
    django.setup()
    from django.core.cache import cache

    cache.set("greeting", {"hello": "world"})
    expect(cache.get("greeting"), {"hello": "world"}, "set/get")
    expect(cache.get("missing", "default"), "default", "get of a missing key")

    cache.set_many({"a": 1, "b": [2], "c": "three"}, timeout=60)
    expect(cache.get_many(["a", "b", "c", "nope"]), {"a": 1, "b": [2], "c": "three"}, "set_many/get_many")
    cache.delete_many(["a", "b"])
    expect(cache.get_many(["a", "b", "c"]), {"c": "three"}, "get_many after delete_many")

    cache.set("n", 10)
    expect(cache.incr("n"), 11, "incr")
    expect(cache.incr("n", 5), 16, "incr by 5")
    expect(cache.decr("n", 6), 10, "decr")
    expect(cache.get("n"), 10, "get after incr/decr")

    expect(cache.add("c", "other"), False, "add of an existing key")
    expect(cache.get("c"), "three", "value kept by failed add")
    expect(cache.add("fresh", "new"), True, "add of a new key")
    expect(cache.get("fresh"), "new", "value set by add")

    expect(cache.touch("fresh", 1000), True, "touch of an existing key")
    ttl = cache._cache.get_client("x").ttl(cache.make_and_validate_key("fresh"))
    if not 900 < ttl <= 1000:
        raise AssertionError(f"TTL after touch(1000) is {ttl}")
    expect(cache.touch("nope", 10), False, "touch of a missing key")

    cache.delete("greeting")
    expect(cache.get("greeting"), None, "get after delete")
    expect(cache.has_key("c"), True, "has_key")
    return "set/get, set_many/get_many, delete_many, incr/decr, add, touch (TTL checked), delete, has_key"


if __name__ == "__main__":
    main({"cache": cache_ops})
