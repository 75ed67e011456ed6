"""redis-py: MULTI/EXEC pipelines, WATCH optimistic locking, and redis.lock.Lock."""

import threading

import redis
from redis.exceptions import WatchError

from common import PREFIX, URL, expect, main


def client():
    return redis.Redis.from_url(URL, socket_timeout=10, socket_connect_timeout=5)


def pipeline():
    r = client()
    k = f"{PREFIX}:counter"
    p = r.pipeline(transaction=True)
    p.set(k, "1").incr(k).get(k)
    expect(p.execute(), [True, 2, b"2"], "MULTI SET/INCR/GET/EXEC")
    expect(r.get(k), b"2", "GET after EXEC")
    # A transaction with a command error inside: EXEC still runs the rest.
    p = r.pipeline(transaction=True)
    p.set(k, "x").incr(k).get(k)
    res = p.execute(raise_on_error=False)
    expect((res[0], type(res[1]).__name__, res[2]), (True, "ResponseError", b"x"), "EXEC with a failing INCR")
    return "pipeline(transaction=True) SET/INCR/GET -> [True, 2, b'2']; in-EXEC error reported per command"


def watch():
    r = client()
    other = client()
    k = f"{PREFIX}:watched"
    r.set(k, "0")

    # 1. A write by another connection between WATCH and EXEC aborts EXEC.
    with r.pipeline() as pipe:
        pipe.watch(k)
        expect(pipe.get(k), b"0", "GET while watching")
        other.set(k, "10")
        pipe.multi()
        pipe.set(k, "from-tx")
        try:
            pipe.execute()
            raise AssertionError("EXEC succeeded although the watched key was changed by another client")
        except WatchError:
            pass
    expect(r.get(k), b"10", "value after aborted EXEC")

    # 2. r.transaction(func, key) retry loop under contention: 4 threads x 25.
    r.set(k, "0")
    attempts = [0]
    lock = threading.Lock()

    def incr(pipe):
        with lock:
            attempts[0] += 1
        v = int(pipe.get(k))
        pipe.multi()
        pipe.set(k, v + 1)

    def worker():
        c = client()
        for _ in range(25):
            c.transaction(incr, k)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=40)
    expect(any(t.is_alive() for t in threads), False, "threads finished")
    expect(r.get(k), b"100", "counter after 100 optimistic increments")
    return f"WATCH conflict aborts EXEC; r.transaction() 100 increments in {attempts[0]} attempts"


def lock():
    r = client()
    name = f"{PREFIX}:lock"
    a = r.lock(name, timeout=10, blocking_timeout=2)
    b = r.lock(name, timeout=10, blocking_timeout=0.3)
    expect(a.acquire(), True, "first acquire")
    expect(a.owned(), True, "owned() by holder")
    expect(b.acquire(), False, "second acquire while held")
    expect(a.extend(5), True, "extend (Lua)")
    a.release()  # Lua compare-and-delete
    expect(r.exists(name), 0, "lock key after release")
    expect(b.acquire(), True, "acquire after release")
    b.release()
    try:
        b.release()
        raise AssertionError("releasing an unheld lock did not raise")
    except redis.exceptions.LockError:
        pass
    return "SET NX PX acquire/contend, extend and release via Lua, LockError on double release"


if __name__ == "__main__":
    main({"pipeline": pipeline, "watch": watch, "lock": lock})
