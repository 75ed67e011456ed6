#!/usr/bin/env python3
"""bench/workload.sh sides: an application's worker processes, in redis-py.

Owns the Python side of the `sides` comparison: N worker processes (forked
from one launcher after redis-py is imported, so that 32 of them start in
milliseconds), each with one connection and, with --csc, its own
client-side cache (redis-py's `cache_config`, RESP3, CLIENT TRACKING in
default mode: needs Redis >= 7.4). The servers, the metrics and the tables
are the script's; wl_client.mjs is the same in node-redis.

Modes:
  load          each worker runs the workload in a closed loop (one operation
                at a time) from --start-at; operations in the first
                --warm-secs are not counted, then --secs are measured, then
                --tail-secs more run uncounted (the script reads the processes'
                CPU and RSS at the window's end, while they still run). Each
                worker writes a report file the `workload --merge` binary
                reads (bench/src/workload/report.rs: latency per operation in
                1 µs buckets) to --hist-dir/proc-I.hist, and a line
                `read_cmds=… write_cmds=… late_ms=…` to proc-I.extra.
  stale-reader  each worker polls GET --key (every --poll-us) from --start-at
                until --until-ms and writes `seq unix_ns` at every change of
                the value it reads to --out-dir/reader-I.txt.
  stale-writer  one connection SETs --key to 1..--writes, --pause-ms apart,
                from --start-at, and writes `seq unix_ns` (the acknowledgement)
                per write to --out.

Workloads (--workload; keys `wl:%08d`, hashes `wlh:%08d`, as the Rust
driver's --populate writes them; ranks drawn Zipf --zipf-s over --keys):
  a        50 % GET, 50 % SET (YCSB A)
  b        95 % GET,  5 % SET (YCSB B)
  c        GET only (YCSB C)
  f        50 % GET, 50 % read-modify-write: GET then SET of the key, one
           operation (YCSB F)
  session  HGETALL, --session-write-pct % HSET of the 10 fields
"""

import argparse
import math
import os
import random
import sys
import time

SPAN_US = 100_000  # buckets of bench/src/hist.rs
MAGIC = "sidecache-bench workload report 1"
HASH_FIELDS = 10


class Zipf:
    """Ranks 0..n-1 with P(r) proportional to 1/(r+1)^s, by rejection-inversion
    (Hörmann and Derflinger 1996, as Apache Commons' sampler): exact, O(1),
    no table (a 10^6-key table per worker process would cost seconds)."""

    def __init__(self, n, s, rng):
        self.n, self.s, self.rng = n, s, rng
        self.hx1 = self._hi(1.5) - 1.0
        self.hn = self._hi(n + 0.5)
        self.cut = 2.0 - self._hii(self._hi(2.5) - self._h(2.0))

    def _h(self, x):
        return math.exp(-self.s * math.log(x))

    @staticmethod
    def _helper1(x):
        return math.log1p(x) / x if abs(x) > 1e-8 else 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))

    @staticmethod
    def _helper2(x):
        return math.expm1(x) / x if abs(x) > 1e-8 else 1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x))

    def _hi(self, x):
        lx = math.log(x)
        return self._helper2((1.0 - self.s) * lx) * lx

    def _hii(self, x):
        t = max(x * (1.0 - self.s), -1.0)
        return math.exp(self._helper1(t) * x)

    def sample(self):
        while True:
            u = self.hn + self.rng.random() * (self.hx1 - self.hn)
            x = self._hii(u)
            k = min(max(int(x + 0.5), 1), self.n)
            if k - x <= self.cut or u >= self._hi(k + 0.5) - self._h(k):
                return k - 1


class Hist:
    def __init__(self):
        self.b, self.count, self.sum_ns, self.over, self.over_max = {}, 0, 0, 0, 0

    def record(self, ns):
        us = ns // 1000
        if us < SPAN_US:
            self.b[us] = self.b.get(us, 0) + 1
        else:
            self.over += 1
            self.over_max = max(self.over_max, us)
        self.count += 1
        self.sum_ns += ns

    def text(self):
        lines = [f"count={self.count} sum_ns={self.sum_ns} over={self.over} over_max_us={self.over_max}"]
        lines += [f"{us} {n}" for us, n in sorted(self.b.items())]
        return "\n".join(lines) + "\n"


def report_text(start_ns, secs, reads, writes, errors, h):
    """A report file of bench/src/workload/report.rs, which `workload
    --merge` reads (percentiles from the merged buckets)."""
    return (f"{MAGIC}\nstart_unix_ns={start_ns} secs={secs} reads={reads} writes={writes} "
            f"errors={errors} nils=0 backwards=0\n{h.text()}")


def add_workload_args(p, procs=1):
    """The flags of the workers' target, client and workload (shared with
    curve.py)."""
    p.add_argument("--target", default="127.0.0.1:6379")
    p.add_argument("--unix")
    p.add_argument("--csc", action="store_true", help="redis-py's client-side cache (RESP3, Redis >= 7.4)")
    p.add_argument("--csc-max-entries", type=int, default=10000)
    p.add_argument("--procs", type=int, default=procs)
    p.add_argument("--workload", choices=["a", "b", "c", "f", "session"], default="b")
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--zipf-s", type=float, default=0.99)
    p.add_argument("--value-size", type=int, default=1024)
    p.add_argument("--session-write-pct", type=float, default=20.0)
    p.add_argument("--seed", type=int)


def client(a):
    import redis

    kw = {"socket_timeout": 30}
    if a.unix:
        kw["unix_socket_path"] = a.unix
    else:
        host, port = a.target.rsplit(":", 1)
        kw.update(host=host, port=int(port))
    if a.csc:
        from redis.cache import CacheConfig

        kw.update(protocol=3, cache_config=CacheConfig(max_size=a.csc_max_entries))
    return redis.Redis(**kw)


def sleep_until_ms(ms):
    d = ms / 1000 - time.time()
    if d > 0:
        time.sleep(d)
    return -d * 1000


def operation(a, idx, r):
    """The workload's next operation, drawn and run: returns whether it
    wrote. Raises what the client raised."""
    rng = random.Random((a.seed or time.time_ns()) ^ (idx + 1) * 0x9E3779B97F4A7C15)
    z = Zipf(a.keys, a.zipf_s, rng)
    wl = a.workload
    val = b"x" * a.value_size
    field = b"y" * max(a.value_size // HASH_FIELDS, 1)
    mapping = {f"f{i}": field for i in range(HASH_FIELDS)}
    wpct = {"a": 50, "b": 5, "c": 0, "f": 50, "session": a.session_write_pct}[wl] / 100.0
    prefix = "wlh:" if wl == "session" else "wl:"
    rand = rng.random

    def op():
        key = f"{prefix}{z.sample():08d}"
        w = rand() < wpct
        if wl == "session":
            if w:
                r.hset(key, mapping=mapping)
            else:
                r.hgetall(key)
        elif w and wl == "f":
            v = r.get(key)
            r.set(key, (v or val)[:-1] + bytes([48 + (rng.randrange(10))]))
        elif w:
            r.set(key, val)
        else:
            r.get(key)
        return w

    return op


def worker_load(a, idx):
    r = client(a)
    r.ping()
    op = operation(a, idx, r)
    f_reads = a.workload == "f"
    late = sleep_until_ms(a.start_at)
    t_meas = a.start_at / 1000 + a.warm_secs
    t_end = t_meas + a.secs
    t_stop = t_end + a.tail_secs
    h = Hist()
    reads = writes = read_cmds = write_cmds = errors = 0
    measuring = done = False
    start_ns = 0
    last_end = t0 = 0
    pc = time.perf_counter_ns
    while True:
        now = time.time()
        if not measuring and not done and now >= t_meas:
            measuring, start_ns, t0 = True, time.time_ns(), pc()
        if now >= t_stop:
            break
        if measuring and now >= t_end:
            measuring, done = False, True
        t = pc()
        w = False
        try:
            w = op()
        except Exception as e:  # counted, the run goes on
            if errors == 0:
                print(f"wl_client: {type(e).__name__}: {e}", file=sys.stderr)
            errors += 1
        if measuring:
            last_end = pc()
            h.record(last_end - t)
            if w:
                writes += 1
                write_cmds += 1
                read_cmds += f_reads
            else:
                reads += 1
                read_cmds += 1
    secs = (last_end - t0) / 1e9 if done else 0.0
    with open(os.path.join(a.hist_dir, f"proc-{idx}.hist"), "w") as f:
        f.write(report_text(start_ns, secs, reads, writes, errors, h))
    with open(os.path.join(a.hist_dir, f"proc-{idx}.extra"), "w") as f:
        f.write(f"read_cmds={read_cmds} write_cmds={write_cmds} late_ms={max(late, 0):.1f}\n")


def worker_reader(a, idx):
    r = client(a)
    r.ping()
    out = []
    last = None
    sleep_until_ms(a.start_at)
    poll = a.poll_us / 1e6
    while time.time() * 1000 < a.until_ms:
        v = r.get(a.key)
        t = time.time_ns()
        if v != last:
            last = v
            out.append(f"{int(v) if v else 0} {t}")
        if poll > 0:
            time.sleep(poll)
    with open(os.path.join(a.out_dir, f"reader-{idx}.txt"), "w") as f:
        f.write("\n".join(out) + "\n")


def stale_writer(a):
    r = client(a)
    r.set(a.key, b"0")
    sleep_until_ms(a.start_at)
    out = []
    for i in range(1, a.writes + 1):
        r.set(a.key, str(i).encode())
        out.append(f"{i} {time.time_ns()}")
        time.sleep(a.pause_ms / 1000)
    with open(a.out, "w") as f:
        f.write("\n".join(out) + "\n")


def run_forked(a, fn):
    """N workers forked after the imports; their pids on stdout, one line."""
    import redis  # noqa: F401  (imported once, before the fork)

    if a.csc:
        import redis.cache  # noqa: F401
    pids = []
    for i in range(a.procs):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                fn(a, i)
            except Exception as e:
                print(f"wl_client worker {i}: {type(e).__name__}: {e}", file=sys.stderr)
                code = 1
            os._exit(code)
        pids.append(pid)
    print(" ".join(map(str, pids)), flush=True)
    rc = 0
    for p in pids:
        _, st = os.waitpid(p, 0)
        rc |= os.waitstatus_to_exitcode(st) != 0
    return rc


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["load", "stale-reader", "stale-writer"])
    add_workload_args(p)
    p.add_argument("--start-at", type=float, default=0, help="unix ms")
    p.add_argument("--warm-secs", type=float, default=1.0)
    p.add_argument("--secs", type=float, default=2.0)
    p.add_argument("--tail-secs", type=float, default=0.5, help="the load goes on, uncounted, while the figures are read")
    p.add_argument("--hist-dir", default=".")
    p.add_argument("--key", default="wlstale:0")
    p.add_argument("--until-ms", type=float, default=0)
    p.add_argument("--poll-us", type=float, default=200)
    p.add_argument("--out-dir", default=".")
    p.add_argument("--writes", type=int, default=40)
    p.add_argument("--pause-ms", type=float, default=25)
    p.add_argument("--out", default="writes.txt")
    a = p.parse_args()
    if a.mode == "stale-writer":
        return stale_writer(a)
    return run_forked(a, worker_load if a.mode == "load" else worker_reader)


if __name__ == "__main__":
    sys.exit(main())
