"""Celery with a Redis broker and Redis result backend.

`send` publishes without a result backend (the producer half only) and reads
the queued message's length from the broker list. `worker` starts a real
worker (`celery -A compat_celery_app worker --pool=solo`, default options) as
a subprocess, still without a result backend, and waits for the task's own
SET to appear. `roundtrip` is the usual setup, broker and result backend:
`add.delay(2, 3).get(timeout=...)` with the worker running.
"""

import os
import sys
import time

import redis

from common import PREFIX, URL, CheckFailed, Worker, expect, main

QUEUE = f"{PREFIX}-celery"


def configure(backend):
    os.environ["COMPAT_CELERY_BROKER"] = URL
    os.environ["COMPAT_CELERY_BACKEND"] = URL if backend else ""
    os.environ["COMPAT_CELERY_QUEUE"] = QUEUE


def send():
    configure(backend=False)
    import compat_celery_app

    r = redis.Redis.from_url(URL, socket_timeout=10)
    for i in range(3):
        compat_celery_app.add.apply_async((i, i))
    # kombu's Redis transport keeps a queue as a list named after it.
    expect(r.llen(QUEUE), 3, "messages in the broker list")
    return "apply_async x3 published (LPUSH), broker list length 3"


def start_worker():
    return Worker(
        [sys.executable, "-m", "celery", "-A", "compat_celery_app", "worker",
         "--pool=solo", "--concurrency=1", "--loglevel=INFO",
         "--hostname", f"{PREFIX}@localhost"],
    )


def worker():
    configure(backend=False)
    import compat_celery_app

    r = redis.Redis.from_url(URL, socket_timeout=10)
    key = f"{PREFIX}:celery-mark"
    proc = start_worker()
    try:
        started = time.monotonic()
        compat_celery_app.mark.delay(key, "done")
        while r.get(key) != b"done":
            if proc.exited():
                raise proc.exited()
            if time.monotonic() - started > 25:
                raise CheckFailed(f"task not run within 25 s; broker list length {r.llen(QUEUE)}")
            time.sleep(0.2)
        return f"worker --pool=solo consumed mark.delay() and ran it after {time.monotonic() - started:.1f}s"
    finally:
        proc.stop()


def roundtrip():
    configure(backend=True)
    import compat_celery_app

    proc = start_worker()
    try:
        started = time.monotonic()
        result = compat_celery_app.add.delay(2, 3)
        try:
            value = result.get(timeout=25)
        except Exception as e:
            if proc.exited():
                raise CheckFailed(f"{type(e).__name__}: {e}; and the {proc.exited()}") from e
            raise
        expect(value, 5, "add.delay(2, 3).get()")
        expect(result.status, "SUCCESS", "result status")
        return f"worker --pool=solo ran add.delay(2, 3); .get() == 5 after {time.monotonic() - started:.1f}s"
    finally:
        proc.stop()


if __name__ == "__main__":
    main({"send": send, "worker": worker, "roundtrip": roundtrip})
