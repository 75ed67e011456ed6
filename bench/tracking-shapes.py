#!/usr/bin/env python3
"""bench/tracking-shapes.py — Redis CPU per write for the shapes a
write-behind batch can take on a tracking connection (issue 18).

    python3 bench/tracking-shapes.py [SHAPE ...]

Each shape: a fresh redis-server, one RESP3 connection pipelining
BATCHES batches of 200 `SET key:<random of 100000> <64 bytes>`, each followed
by a PING whose answer is awaited; the redis-server process's utime+stime
(/proc/PID/stat) divided by the writes.

  plain        the SETs
  multi        MULTI, the SETs, EXEC
  trail        CLIENT CACHING YES, MULTI, the SETs, EXISTS of the keys, EXEC
               (OPTIN tracking on: the keys are tracked again after the write)
  nolooptrail  trail with NOLOOP
  full         what sidecache's optin batches are: trail with an EXISTS of
               the keys before the SETs too (every write then sends the
               connection one invalidation, which sidecache skips)

Knobs (environment): BATCHES=1500. Only the servers it started are stopped.
"""
import os
import random
import socket
import subprocess
import sys
import time

BATCHES = int(os.environ.get("BATCHES", "1500"))
N = 200
KEYSPACE = 100000
HZ = os.sysconf("SC_CLK_TCK")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def enc(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


def ticks(pid):
    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])


def run(shape):
    port = free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                s = socket.create_connection(("127.0.0.1", port))
                break
            except OSError:
                time.sleep(0.05)
        s.sendall(enc("HELLO", "3"))
        s.recv(65536)
        tracked = shape in ("trail", "nolooptrail", "full")
        if tracked:
            s.sendall(enc("CLIENT", "TRACKING", "ON", "OPTIN", *(["NOLOOP"] if shape == "nolooptrail" else [])))
            s.recv(65536)
        rnd = random.Random(1)
        value = b"x" * 64
        t0 = ticks(redis.pid)
        for _ in range(BATCHES):
            keys = [b"key:%d" % rnd.randrange(KEYSPACE) for _ in range(N)]
            out = []
            if tracked:
                out.append(enc("CLIENT", "CACHING", "YES"))
            if shape != "plain":
                out.append(enc("MULTI"))
            if shape == "full":
                out.append(enc("EXISTS", *keys))
            out.extend(enc("SET", k, value) for k in keys)
            if tracked:
                out.append(enc("EXISTS", *keys))
            if shape != "plain":
                out.append(enc("EXEC"))
            out.append(enc("PING"))
            s.sendall(b"".join(out))
            buf = b""
            while not buf.endswith(b"+PONG\r\n"):
                buf += s.recv(1 << 20)
        t1 = ticks(redis.pid)
        return (t1 - t0) / HZ / (BATCHES * N) * 1e6
    finally:
        redis.kill()
        redis.wait()


for shape in sys.argv[1:] or ["plain", "multi", "trail", "nolooptrail", "full"]:
    print("%-12s %.2f µs of Redis CPU per write" % (shape, run(shape)))
