#!/usr/bin/env python3
"""bench/workload.sh curve: latency against offered load, warm, open loop.

One run of this launcher is one side's curve: N redis-py worker processes
(forked after redis-py is imported, one connection each, the workloads of
wl_client.py) that

  1. warm the cache in a closed loop until its hit ratio is stable: each
     second's hit ratio within --stable-points of the others over the last
     --stable-secs seconds (at most --warm-max-secs; none for a side without
     a cache);
  2. then, for each rate of --rates (operations per second in all, split
     evenly between the workers), run an open loop for --cell-secs: each
     worker sends at Poisson arrival times, whatever the replies do, and
     times each operation from its intended send time, so a send that is
     late because the worker was still waiting counts as waiting
     (coordinated omission corrected, as wrk2 and YCSB's -target do);
  3. stop after the first cell whose p99 passes --stop-p99-us.

The launcher steers the workers through a shared page (mmap before the
fork): the phase (0 warm-up, k the k-th cell, -1 the end) and each
worker's rate. At a phase change each worker writes the cell it leaves
as a workload report (1 µs buckets up to 100 ms) to --hist-dir, and the
launcher merges the workers' reports with `workload --merge` (--merge-bin).

Measured by the launcher around each cell, from outside the workers:
Redis's commands, its CPU (schedstat, ns), the bytes in and out of it
(INFO stats: what crosses the network to Redis), the CPU of the workers and
of sidecache (--sc-pid), and the hit ratio: sidecache's L1 counters
(--sc-metrics) or, for a client-side cache, 1 − the reads Redis ran ÷ the
reads the workers made.

Writes one CSV row per cell to --out (appending; the header when the file
is new), and a line per cell on stderr.
"""

import argparse
import csv
import glob
import mmap
import os
import random
import struct
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wl_client  # noqa: E402

PAGE = 4096
PAUSE = 1 << 40  # phases from here on: between cells, no operations
WORKER_BASE = 64  # per worker: ready, reads made, ops made (int64 each)
COLUMNS = ["label", "side", "workload", "procs", "rtt_ms", "cell", "offered_per_s", "secs", "ops", "ops_per_s",
           "p50_us", "p99_us", "p999_us", "max_us", "errors", "hit_ratio", "redis_cmds_per_op",
           "redis_cpu_us_per_op", "redis_bytes_in_per_op", "redis_bytes_out_per_op", "host_cpu_us_per_op",
           "sidecache_cpu_us_per_op", "warm_secs", "warm_hit_ratio", "load_avg"]


class Shared:
    def __init__(self, procs):
        self.m = mmap.mmap(-1, max(PAGE, WORKER_BASE + 24 * procs))

    def phase(self):
        return struct.unpack_from("q", self.m, 0)[0]

    def set_phase(self, p, rate):
        struct.pack_into("d", self.m, 8, rate)
        struct.pack_into("q", self.m, 0, p)

    def rate(self):
        return struct.unpack_from("d", self.m, 8)[0]

    def add(self, idx, slot, n=1):
        off = WORKER_BASE + 24 * idx + 8 * slot
        struct.pack_into("q", self.m, off, struct.unpack_from("q", self.m, off)[0] + n)

    def total(self, procs, slot):
        return sum(struct.unpack_from("q", self.m, WORKER_BASE + 24 * i + 8 * slot)[0] for i in range(procs))


def exact_sleeps():
    """Timer slack to 1 ns (prctl PR_SET_TIMERSLACK): a thread's sleeps
    otherwise end up to 50 µs late, and that lateness would count as the
    side's latency."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def worker(a, idx, sh):
    exact_sleeps()
    r = wl_client.client(a)
    r.ping()
    op = wl_client.operation(a, idx, r)
    reads_per_write = 1 if a.workload == "f" else 0
    sh.add(idx, 0)  # ready
    rng = random.Random(idx * 7919 + 1)
    pc = time.perf_counter_ns
    cur = 0
    rate = 0.0
    h = wl_client.Hist()
    errors = reads = writes = 0
    nxt = began = last = began_ns = 0
    while True:
        ph = sh.phase()
        if ph != cur:
            if 0 < cur < PAUSE:
                path = os.path.join(a.hist_dir, f"cell-{cur}-proc-{idx}.hist")
                with open(path + ".part", "w") as f:
                    f.write(wl_client.report_text(began_ns, (last - began) / 1e9, reads, writes, errors, h))
                os.rename(path + ".part", path)  # whole when the launcher sees it
            if ph < 0:
                return
            cur, rate, h, errors, reads, writes = ph, sh.rate(), wl_client.Hist(), 0, 0, 0
            nxt = began = last = pc()
            began_ns = time.time_ns()
        if cur >= PAUSE:
            time.sleep(0.001)
            continue
        if cur > 0 and rate > 0:
            nxt += int(rng.expovariate(rate) * 1e9)
            d = nxt - pc()
            if d > 0:
                time.sleep(d / 1e9)
            start = nxt
        else:
            start = pc()
        try:
            w = op()
        except Exception as e:  # counted, the run goes on
            if errors == 0:
                print(f"curve worker {idx}: {type(e).__name__}: {e}", file=sys.stderr)
            errors += 1
            w = True  # not counted as a read
        if not w or reads_per_write:
            sh.add(idx, 1)
        if cur > 0:
            last = pc()
            h.record(last - start)
            writes += w
            reads += not w


def schedstat_ns(pids):
    s = 0
    for p in pids:
        for f in glob.glob(f"/proc/{p}/task/*/schedstat"):
            try:
                s += int(open(f).read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    return s


def metric(text, name):
    s = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            s += float(line.rsplit(" ", 1)[1])
    return s


class Probe:
    """What one side costs around a window, read from outside the workers."""

    def __init__(self, a, procs, sh, pids):
        import redis

        self.a, self.procs, self.sh, self.pids = a, procs, sh, pids
        self.redis = redis.Redis(host="127.0.0.1", port=a.redis_port)

    def read(self):
        cs = self.redis.info("commandstats")
        st = self.redis.info("stats")
        calls = sum(v["calls"] for v in cs.values())
        reads = sum(cs.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("get", "hgetall"))
        hits = misses = 0.0
        if self.a.sc_metrics:
            text = urllib.request.urlopen(self.a.sc_metrics, timeout=5).read().decode()
            hits, misses = metric(text, "sidecache_l1_hits_total"), metric(text, "sidecache_l1_misses_total")
        return {
            "t": time.monotonic(), "calls": calls, "reads": reads,
            "in": st["total_net_input_bytes"], "out": st["total_net_output_bytes"],
            "redis_ns": schedstat_ns([self.a.redis_pid]),
            "host_ns": schedstat_ns(self.pids + ([self.a.sc_pid] if self.a.sc_pid else [])),
            "sc_ns": schedstat_ns([self.a.sc_pid]) if self.a.sc_pid else 0,
            "hits": hits, "misses": misses, "made": self.sh.total(self.procs, 1),
        }

    def hit_ratio(self, x, y):
        if self.a.sc_metrics:
            n = (y["hits"] - x["hits"]) + (y["misses"] - x["misses"])
            return (y["hits"] - x["hits"]) / n if n else None
        if self.a.csc:
            made = y["made"] - x["made"]
            # less the INFO calls of the probe itself: none are reads
            return max(0.0, 1 - (y["reads"] - x["reads"]) / made) if made else None
        return 0.0


def merge(a, files):
    """The cell's figures: `workload --merge` of the workers' reports."""
    out = subprocess.run([a.merge_bin, "--merge", *files], check=True, capture_output=True, text=True).stdout
    return dict(kv.split("=", 1) for kv in out.split())


def launcher(a):
    import redis  # noqa: F401  (imported once, before the fork)

    if a.csc:
        import redis.cache  # noqa: F401
    sh = Shared(a.procs)
    pids = []
    for i in range(a.procs):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                worker(a, i, sh)
            except Exception as e:
                print(f"curve worker {i}: {type(e).__name__}: {e}", file=sys.stderr)
                code = 1
            os._exit(code)
        pids.append(pid)
    try:
        return run(a, sh, pids)
    finally:
        sh.set_phase(-1, 0)
        for p in pids:
            os.waitpid(p, 0)


def log(msg):
    print(f"[curve] {msg}", file=sys.stderr, flush=True)


def run(a, sh, pids):
    deadline = time.monotonic() + 60
    while sh.total(a.procs, 0) < a.procs:
        if time.monotonic() > deadline:
            sys.exit("curve: the workers did not all connect within 60 s")
        time.sleep(0.05)
    probe = Probe(a, a.procs, sh, pids)
    # 1. warm-up, closed loop
    t0 = time.monotonic()
    warm_hit = ""
    if a.sc_metrics or a.csc:
        seconds = [probe.read()]
        ratios = []
        while True:
            time.sleep(1)
            seconds.append(probe.read())
            hr = probe.hit_ratio(seconds[-2], seconds[-1])
            if hr is not None:
                ratios.append(hr)
            last = ratios[-a.stable_secs:]
            if len(last) >= a.stable_secs and max(last) - min(last) <= a.stable_points:
                warm_hit = f"{sum(last) / len(last):.4f}"
                break
            if time.monotonic() - t0 >= a.warm_max_secs:
                warm_hit = f"{sum(last) / len(last):.4f}" if last else ""
                log(f"warning: {a.label} not stable after {a.warm_max_secs} s (last seconds: "
                    + " ".join(f"{x:.3f}" for x in last) + ")")
                break
    else:
        time.sleep(a.warm_min_secs)
    warm_secs = time.monotonic() - t0
    log(f"{a.label}: warm after {warm_secs:.1f} s, hit ratio {warm_hit or '-'}")
    # 2. the cells
    new = not os.path.exists(a.out) or os.path.getsize(a.out) == 0
    with open(a.out, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(COLUMNS)
        for k, rate in enumerate(a.rates, 1):
            sh.set_phase(k, rate / a.procs)
            x = probe.read()
            time.sleep(a.cell_secs)
            y = probe.read()
            sh.set_phase(PAUSE + k, 0)  # each worker writes the cell's histogram, then waits
            files = [os.path.join(a.hist_dir, f"cell-{k}-proc-{i}.hist") for i in range(a.procs)]
            deadline = time.monotonic() + 30
            while not all(os.path.exists(p) for p in files):
                if time.monotonic() > deadline:
                    sys.exit(f"curve: cell {k}: not every worker wrote its histogram within 30 s")
                time.sleep(0.02)
            m = merge(a, files)
            ops, errors, p50, p99, p999, mx = (int(m["ops"]), int(m["errors"]), float(m["p50_us"]),
                                               float(m["p99_us"]), float(m["p999_us"]), float(m["max_us"]))
            secs = y["t"] - x["t"]
            hr = probe.hit_ratio(x, y)

            def per(v, scale=1.0):
                return f"{v * scale / ops:.3f}" if ops else ""

            row = [a.label, a.side, a.workload, a.procs, a.rtt_ms, k, f"{rate:.0f}", f"{secs:.2f}", ops,
                   f"{ops / secs:.0f}", p50, p99, p999, mx, errors, "" if hr is None else f"{hr:.4f}",
                   per(y["calls"] - x["calls"] - 2), per(y["redis_ns"] - x["redis_ns"], 1e-3),
                   per(y["in"] - x["in"]), per(y["out"] - x["out"]), per(y["host_ns"] - x["host_ns"], 1e-3),
                   per(y["sc_ns"] - x["sc_ns"], 1e-3) if a.sc_pid else "", f"{warm_secs:.1f}", warm_hit,
                   open("/proc/loadavg").read().split()[0]]
            w.writerow(row)
            f.flush()
            log(f"{a.label}: offered {rate:.0f}/s: {ops / secs:.0f}/s p50 {p50} p99 {p99} p99.9 {p999} µs, "
                f"hit {row[15] or '-'}, redis cmds/op {row[16]}, errors {errors}")
            for p in files:
                os.remove(p)
            if p99 > a.stop_p99_us:
                break
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    wl_client.add_workload_args(p, procs=8)
    p.add_argument("--merge-bin", required=True, help="bench's `workload` binary: its --merge reads the cells' reports")
    p.add_argument("--rates", required=True, help="ops/s in all, space- or comma-separated")
    p.add_argument("--cell-secs", type=float, default=20)
    p.add_argument("--stop-p99-us", type=int, default=5000)
    p.add_argument("--stable-secs", type=int, default=5)
    p.add_argument("--stable-points", type=float, default=0.01)
    p.add_argument("--warm-max-secs", type=float, default=600)
    p.add_argument("--warm-min-secs", type=float, default=2, help="a side without a cache: connections settle")
    p.add_argument("--redis-port", type=int, required=True, help="Redis itself, not the relay: for INFO")
    p.add_argument("--redis-pid", type=int, required=True)
    p.add_argument("--sc-pid", type=int)
    p.add_argument("--sc-metrics", help="sidecache's /metrics URL")
    p.add_argument("--label", default="side")
    p.add_argument("--side", default="")
    p.add_argument("--rtt-ms", default="0")
    p.add_argument("--hist-dir", default=".")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    a.rates = [float(x) for x in a.rates.replace(",", " ").split()]
    if not a.rates or min(a.rates) <= 0:
        p.error("--rates: positive rates")
    return launcher(a)


if __name__ == "__main__":
    sys.exit(main())
