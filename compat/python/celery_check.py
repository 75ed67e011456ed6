"""Celery with a Redis broker and Redis result backend.

`send` publishes without a result backend (the producer half only) and reads
the queued message's length from the broker list. `worker` starts a real
worker (`celery -A compat_celery_app worker --pool=solo`, default options) as
a subprocess, still without a result backend, and waits for the task's own
SET to appear. `roundtrip` is the usual setup, broker and result backend:
`add.delay(2, 3).get(timeout=...)` with the worker running.

`broadcast` is the remote-control path: kombu's fanout exchange
`celery.pidbox` is Redis pub/sub (the worker PSUBSCRIBEs to
`/0.celery.pidbox`, the client PUBLISHes there) and replies come back on a
list (`reply.celery.pidbox`, BRPOP). `result` is the result backend's
pub/sub path: `AsyncResult.get()` SUBSCRIBEs to `celery-task-meta-<id>` and
the worker PUBLISHes the result there (inside MULTI, with the SETEX).
"""

import os
import sys
import threading
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


HOSTNAME = f"{PREFIX}@localhost"


def start_worker(pool="solo", concurrency=1):
    return Worker(
        [sys.executable, "-m", "celery", "-A", "compat_celery_app", "worker",
         f"--pool={pool}", f"--concurrency={concurrency}", "--loglevel=INFO",
         "--hostname", HOSTNAME],
    )


def wait_for(predicate, seconds, what, proc):
    """Poll predicate() until it returns something true; fail naming `what`."""
    started = time.monotonic()
    while True:
        value = predicate()
        if value:
            return value
        if proc.exited():
            raise CheckFailed(f"waiting for {what}: the {proc.exited()}")
        if time.monotonic() - started > seconds:
            raise CheckFailed(f"{what}: not within {seconds} s")
        time.sleep(0.1)


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


def broadcast():
    """Remote control over the pidbox fanout exchange, with replies."""
    configure(backend=False)
    import compat_celery_app

    control = compat_celery_app.app.control
    # threads pool: the worker answers control commands while a task runs.
    proc = start_worker(pool="threads", concurrency=2)
    try:
        started = time.monotonic()
        # 1. ping (broadcast + reply) until the worker's pidbox consumer is up.
        replies = wait_for(lambda: control.ping(destination=[HOSTNAME], timeout=1),
                           30, "a reply to control.ping()", proc)
        expect(replies, [{HOSTNAME: {"ok": "pong"}}], "control.ping() replies")
        up = time.monotonic() - started
        # 2. inspect().active() names the task the worker is running.
        napping = compat_celery_app.nap.delay(5)

        def active():
            found = control.inspect(destination=[HOSTNAME], timeout=1).active() or {}
            return [t for t in found.get(HOSTNAME, []) if t["id"] == napping.id]

        tasks = wait_for(active, 15, f"task {napping.id} in inspect().active()", proc)
        expect([(t["name"], t["args"]) for t in tasks], [("compat_celery_app.nap", [5])],
               "inspect().active() entry")
        # 3. a broadcast command with reply, that changes the worker's state.
        replies = control.broadcast(
            "rate_limit", arguments={"task_name": "compat_celery_app.add", "rate_limit": "7/m"},
            destination=[HOSTNAME], reply=True, timeout=3)
        expect(replies, [{HOSTNAME: {"ok": "new rate limit set successfully"}}],
               "broadcast('rate_limit') replies")
        registered = control.inspect(destination=[HOSTNAME], timeout=3).registered("rate_limit") or {}
        listed = [t for t in registered.get(HOSTNAME, []) if t.startswith("compat_celery_app.add ")]
        expect(listed, ["compat_celery_app.add [rate_limit=7/m]"], "inspect().registered('rate_limit')")
        # 4. broadcast shutdown (no reply): the worker finishes nap() and exits 0.
        control.broadcast("shutdown", destination=[HOSTNAME])
        deadline = time.monotonic() + 20
        while proc.proc.poll() is None:
            if time.monotonic() > deadline:
                raise CheckFailed("worker still running 20 s after broadcast('shutdown')")
            time.sleep(0.1)
        expect(proc.proc.returncode, 0, "worker exit status after broadcast('shutdown')")
        return (f"worker (threads pool) up after {up:.1f}s: ping -> pong, inspect().active() "
                "lists nap(5), broadcast('rate_limit') replied ok and registered() shows 7/m, "
                "broadcast('shutdown') -> exit 0")
    finally:
        proc.stop()


def result():
    """AsyncResult.get() waiting on the pub/sub channel celery-task-meta-<id>."""
    configure(backend=True)
    import compat_celery_app
    from celery import group

    r = redis.Redis.from_url(URL, socket_timeout=10)

    def numsub(key):
        return r.pubsub_numsub(key)[0][1]

    proc = start_worker()
    try:
        started = time.monotonic()
        # 1. get() waits before the result exists: the backend has SUBSCRIBEd
        #    (seen with PUBSUB NUMSUB while the result key is still absent), so
        #    the value can only arrive by PUBLISH.
        res = compat_celery_app.slow_add.delay(2, 3, 1.5)
        key = f"celery-task-meta-{res.id}"
        box = {}

        def waiter():
            try:
                box["value"] = res.get(timeout=30)
            except BaseException as e:  # noqa: BLE001 - reported below
                box["error"] = e

        thread = threading.Thread(target=waiter, daemon=True)
        thread.start()
        wait_for(lambda: numsub(key) >= 1 and r.exists(key) == 0, 20,
                 f"a subscriber on {key} while the result is pending", proc)
        thread.join(timeout=35)
        if thread.is_alive():
            raise CheckFailed(f"get() still waiting after 35 s; result key exists: {r.exists(key)}")
        if "error" in box:
            raise CheckFailed(f"get(): {type(box['error']).__name__}: {box['error']}")
        expect(box["value"], 5, "slow_add.delay(2, 3).get()")
        expect(res.status, "SUCCESS", "status")
        waited = time.monotonic() - started
        # The backend UNSUBSCRIBEs once the task is ready.
        wait_for(lambda: numsub(key) == 0, 10, f"no subscriber left on {key}", proc)
        # 2. a failure travels the same way and is raised by get().
        failing = compat_celery_app.fail.delay("boom")
        try:
            failing.get(timeout=20)
            raise CheckFailed("get() of a failing task returned instead of raising")
        except ValueError as e:
            expect(str(e), "boom", "exception raised by get()")
        expect(failing.status, "FAILURE", "status of the failing task")
        # 3. several pending results on one pub/sub connection (join_native).
        values = group(compat_celery_app.slow_add.s(i, i, 0.3) for i in range(3)).apply_async().get(timeout=20)
        expect(values, [0, 2, 4], "group(slow_add x3).get()")
        return (f"get() subscribed to celery-task-meta-<id> before the result existed, got 5 after "
                f"{waited:.1f}s, then unsubscribed; failure raised ValueError('boom'); group get() [0, 2, 4]")
    finally:
        proc.stop()


if __name__ == "__main__":
    main({"send": send, "worker": worker, "roundtrip": roundtrip,
          "broadcast": broadcast, "result": result})
