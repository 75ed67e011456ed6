#!/usr/bin/env python3
"""bench/failover_reader.py — the application of bench/failover.sh.

  failover_reader.py populate --port P --keys N
      writes fo:0 … fo:N-1 = v0 … v(N-1) straight into the Redis Cluster
      that P belongs to (redis.cluster.RedisCluster, pipelined).

  failover_reader.py read --client cluster|standalone --port P --keys N
                          --duration S --kill-at S --kill-pid PID
                          --kill-stamp FILE --out FILE.json
      reads every key twice (sidecache's L1 then holds them), then for
      --duration seconds GETs fo:0 … fo:N-1 over and over, one at a time,
      checking each value. --kill-at seconds into that loop a timer thread
      sends SIGKILL to --kill-pid and writes the wall-clock time of the kill
      (epoch ms) to --kill-stamp. Every exception counts as one error (its
      time since the kill, at the moment the client raised it, and its
      first 80 characters); a reply other than v{i} is a wrong value; reads
      over 100 ms (errors or not) are counted with their total time. The
      summary goes to --out as JSON.

`cluster`: RedisCluster(host, port), redis-py's defaults otherwise.
`standalone`: Redis(host, port, socket_timeout=15), redis-py's defaults
otherwise (sidecache in front of the cluster).
"""
import argparse
import collections
import json
import os
import signal
import sys
import threading
import time

import redis
from redis.cluster import RedisCluster

HOST = "127.0.0.1"
SLOW_S = 0.1  # a read this long (seconds) is a stall the application notices


def key(i):
    return f"fo:{i}"


def val(i):
    return f"v{i}"


def populate(a):
    rc = RedisCluster(host=HOST, port=a.port, decode_responses=True)
    pipe = rc.pipeline()
    for i in range(a.keys):
        pipe.set(key(i), val(i))
    pipe.execute()
    for i in range(a.keys):
        if rc.get(key(i)) != val(i):
            sys.exit(f"populate: {key(i)} did not read back")
    rc.close()


def client(a):
    if a.client == "cluster":
        return RedisCluster(host=HOST, port=a.port, decode_responses=True)
    return redis.Redis(host=HOST, port=a.port, socket_timeout=15, decode_responses=True)


def read(a):
    c = client(a)
    # Warm-up: every key twice (the first fills sidecache's L1, the second hits it).
    for _ in range(2):
        for i in range(a.keys):
            v = c.get(key(i))
            if v != val(i):
                sys.exit(f"warm-up: {key(i)} = {v!r}")

    killed = {}

    def kill():
        os.kill(a.kill_pid, signal.SIGKILL)
        killed["mono"] = time.monotonic()
        wall = time.time()
        tmp = a.kill_stamp + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{int(wall * 1000)}\n")
        os.replace(tmp, a.kill_stamp)

    t0 = time.monotonic()
    timer = threading.Timer(a.kill_at, kill)
    timer.daemon = True
    timer.start()
    end = t0 + a.duration
    reads = 0
    errors = []  # (monotonic when raised, text)
    wrong = []  # (monotonic, key, value)
    longest = (0.0, t0)  # (seconds, monotonic at its end)
    slow = []  # durations of reads over SLOW_S
    i = 0
    while True:
        s = time.monotonic()
        if s >= end:
            break
        k = i % a.keys
        i += 1
        reads += 1
        try:
            v = c.get(key(k))
            e = time.monotonic()
            if v != val(k):
                wrong.append((e, key(k), v))
        except Exception as ex:  # noqa: BLE001 — any exception is one error the application sees
            e = time.monotonic()
            text = f"{type(ex).__name__}: {ex}".replace("\n", " ").replace("\r", " ")
            errors.append((e, text[:80]))
        if e - s > longest[0]:
            longest = (e - s, e)
        if e - s > SLOW_S:
            slow.append(e - s)
    elapsed = time.monotonic() - t0
    timer.join()
    km = killed.get("mono")
    if km is None:
        sys.exit("the kill never happened (DURATION <= KILL_AT?)")

    def since(m):
        return round(m - km, 3)

    texts = collections.Counter(t for _, t in errors)
    by_second = collections.Counter(int((m - km) // 1) for m, _ in errors)
    out = {
        "reads": reads,
        "errors": len(errors),
        "wrong_values": len(wrong),
        "wrong_examples": [f"{k}={v!r}" for _, k, v in wrong[:3]],
        "elapsed_s": round(elapsed, 3),
        "reads_per_s": round(reads / elapsed, 1),
        "first_error_s": since(errors[0][0]) if errors else None,
        "last_error_s": since(errors[-1][0]) if errors else None,
        "errors_before_kill": sum(1 for m, _ in errors if m < km),
        "top_errors": texts.most_common(3),
        "distinct_errors": len(texts),
        "errors_by_second": sorted(by_second.items()),
        "longest_read_s": round(longest[0], 3),
        "longest_read_end_s": since(longest[1]),
        "slow_reads": len(slow),
        "slow_read_s": round(sum(slow), 3),
        "redis_py": redis.__version__,
    }
    with open(a.out, "w") as f:
        json.dump(out, f)
    try:
        c.close()
    except Exception:  # noqa: BLE001 — closing after a failover may fail; the run is done
        pass


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("populate")
    pp.add_argument("--port", type=int, required=True)
    pp.add_argument("--keys", type=int, required=True)
    pr = sub.add_parser("read")
    pr.add_argument("--client", choices=["cluster", "standalone"], required=True)
    pr.add_argument("--port", type=int, required=True)
    pr.add_argument("--keys", type=int, required=True)
    pr.add_argument("--duration", type=float, required=True)
    pr.add_argument("--kill-at", type=float, required=True)
    pr.add_argument("--kill-pid", type=int, required=True)
    pr.add_argument("--kill-stamp", required=True)
    pr.add_argument("--out", required=True)
    a = p.parse_args()
    if a.cmd == "populate":
        populate(a)
    else:
        read(a)


if __name__ == "__main__":
    main()
