#!/usr/bin/env python3
"""The tables and the chart of `bench/workload.sh sides`, from its CSVs.

  workload-sides-report.py --raw R.csv --stale S.csv --header TEXT --out FILE.md
  workload-sides-report.py --raw R.csv --stale S.csv --chart FILE.png [--chart-workload b] [--chart-rtt 0.5]

The chart: six panels against the number of worker processes, one line per
side, for one workload at one round trip: p99 latency, ops/s, Redis
commands per operation, host CPU per operation, host memory (sum of RSS)
and the time for a write made directly to Redis to reach every reader
(p99). It is drawn by gnuplot (a .gp file written beside the PNG, then
run): nothing outside the standard library. Owns no measuring.
"""

import argparse
import csv
import os
import sys

import gnuplot_draw

WORKLOADS = {
    "a": "YCSB A (50 % GET, 50 % SET)",
    "b": "YCSB B (95 % GET, 5 % SET)",
    "c": "YCSB C (GET only)",
    "f": "YCSB F (50 % GET, 50 % read-modify-write)",
    "session": "session store (HGETALL, HSET of 10 fields)",
}
SIDE_NAMES = {
    "direct": "direct Redis",
    "sc-tcp": "sidecache TCP",
    "sc-unix": "sidecache Unix",
    "csc-py": "redis-py cache_config",
    "csc-node": "node-redis clientSideCache",
}


def fnum(v, d=1):
    if v in (None, ""):
        return "—"
    try:
        x = float(v)
    except ValueError:
        return v
    if x != x:
        return "—"
    return f"{x:,.{d}f}"


def rtt_name(r):
    return "on loopback" if float(r) == 0 else f"at a {r} ms round trip"


def tables(a):
    rows = list(csv.DictReader(open(a.raw)))
    stale = list(csv.DictReader(open(a.stale))) if a.stale and os.path.exists(a.stale) else []
    rtts, wls, sides, ns = [], [], [], []
    for r in rows:
        for lst, k in ((rtts, "rtt_ms"), (wls, "workload"), (sides, "side"), (ns, "procs")):
            if r[k] not in lst:
                lst.append(r[k])
    ns.sort(key=int)
    L = [a.header, "",
         "Per operation (a YCSB F read-modify-write is one operation of two commands); latency per operation, µs; "
         "hit ratio: sidecache's L1 counters for sidecache, 1 − (GET + HGETALL Redis ran) / (reads the workers sent) "
         "for the client-side caches, 0 for direct; Redis cmds: every command Redis ran (INFO commandstats), "
         "tracking and invalidation bookkeeping included; host CPU: every worker process plus sidecache "
         "(utime + stime); host RSS: their sum at the end of the window. † N ms: a worker sent its first operation "
         "that long after the others (the machine was busy); the first WARM_SECS are not counted.", ""]
    for rtt in rtts:
        for wl in wls:
            L += [f"### {WORKLOADS.get(wl, wl)}, {rtt_name(rtt)}", "",
                  "| N | side | ops/s | p50 | p99 | p99.9 | hit ratio | Redis cmds/op | Redis CPU µs/op | host CPU µs/op | host RSS MB |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
            for n in ns:
                for side in sides:
                    r = next((r for r in rows if (r["rtt_ms"], r["workload"], r["side"], r["procs"]) == (rtt, wl, side, n)), None)
                    if not r:
                        continue
                    late = float(r.get("late_ms") or 0)
                    mark = f" † {late:,.0f} ms" if late > 50 else ""
                    L.append(f"| {n} | {SIDE_NAMES.get(side, side)}{mark} | {fnum(r['ops_per_s'], 0)} | {fnum(r['p50_us'])} | "
                             f"{fnum(r['p99_us'])} | {fnum(r['p999_us'])} | {fnum(r['hit_ratio'], 3)} | "
                             f"{fnum(r['redis_cmds_per_op'], 3)} | {fnum(r['redis_cpu_us_per_op'], 2)} | "
                             f"{fnum(r['host_cpu_us_per_op'], 1)} | {fnum(r['host_rss_mb'], 0)} |")
            L.append("")
        st = [s for s in stale if s["rtt_ms"] == rtt]
        if st:
            L += [f"### A write made directly to Redis, until every reader read it, {rtt_name(rtt)}", "",
                  "µs from the writer's acknowledgement until the last of N readers (each polling the key through the side) "
                  "had read the new value: p50 / p99 / max over the writes; `unseen`: writes some reader never read.", "",
                  "| side | " + " | ".join(f"N = {n}" for n in ns) + " |", "|---|" + "---:|" * len(ns)]
            for side in sides:
                cells = []
                for n in ns:
                    s = next((s for s in st if s["side"] == side and s["procs"] == n), None)
                    if not s:
                        cells.append("—")
                        continue
                    c = f"{fnum(s['p50_us'], 0)} / {fnum(s['p99_us'], 0)} / {fnum(s['max_us'], 0)}"
                    if s["unseen"] not in ("", "0"):
                        c += f" ({s['unseen']} unseen)"
                    cells.append(c)
                L.append(f"| {SIDE_NAMES.get(side, side)} | " + " | ".join(cells) + " |")
            L.append("")
    open(a.out, "w").write("\n".join(L))


def chart(a):
    rows = [r for r in csv.DictReader(open(a.raw)) if r["workload"] == a.chart_workload and float(r["rtt_ms"]) == float(a.chart_rtt)]
    stale = [s for s in csv.DictReader(open(a.stale)) if float(s["rtt_ms"]) == float(a.chart_rtt)] if a.stale and os.path.exists(a.stale) else []
    if not rows:
        sys.exit(f"no rows for workload {a.chart_workload} at rtt {a.chart_rtt}")
    sides = []
    for r in rows:
        if r["side"] not in sides:
            sides.append(r["side"])
    base = os.path.splitext(a.chart)[0]
    for side in sides:
        with open(f"{base}-{side}.dat", "w") as f:
            f.write("# procs ops_per_s p99_us redis_cmds_per_op host_cpu_us_per_op host_rss_mb stale_p99_us\n")
            for r in sorted((r for r in rows if r["side"] == side), key=lambda r: int(r["procs"])):
                s = next((s for s in stale if s["side"] == side and s["procs"] == r["procs"]), None)
                sp = s["p99_us"] if s and s["p99_us"] not in ("", "nan") else "NaN"
                f.write(f"{r['procs']} {r['ops_per_s']} {r['p99_us']} {r['redis_cmds_per_op']} {r['host_cpu_us_per_op']} {r['host_rss_mb']} {sp}\n")
    ns = sorted({int(r["procs"]) for r in rows})
    panels = [(3, "p99 latency per operation, µs", True), (2, "operations per second", False),
              (4, "Redis commands per operation", False), (5, "host CPU per operation, µs", False),
              (6, "host memory (sum of RSS), MB", True), (7, "write to every reader, p99, µs", True)]
    title = f"{WORKLOADS.get(a.chart_workload, a.chart_workload)}, {rtt_name(a.chart_rtt)}; Zipf 0.99 over 10^6 keys"
    gp = [f"set terminal pngcairo size 1200,1050 font 'sans,10'", f"set output '{a.chart}'",
          f"set multiplot layout 3,2 title \"{title}\" font 'sans,12'",
          "set key top left font 'sans,9'", "set grid", "set logscale x 2",
          f"set xrange [{ns[0] * 0.8}:{ns[-1] * 1.25}]", f"set xtics ({', '.join(str(n) for n in ns)})",
          "set xlabel 'worker processes'", "set style data linespoints"]
    colours = {"direct": "#555555", "sc-tcp": "#1f77b4", "sc-unix": "#17becf", "csc-py": "#d62728", "csc-node": "#ff7f0e"}
    def has_data(col):
        for side in sides:
            for line in open(f"{base}-{side}.dat"):
                v = line.split()[col - 1]
                if not line.startswith("#") and v not in ("NaN", "nan", "") and float(v) > 0:
                    return True
        return False

    for col, label, logy in panels:
        gp.append(f"set title '{label}'")
        if not has_data(col):
            gp += ["unset logscale y", "set yrange [0:1]", "set label 1 'no data' at graph 0.45, 0.5",
                   "plot 2 notitle", "unset label 1"]
            continue
        gp.append("set logscale y" if logy else "unset logscale y")
        gp.append("set yrange [*:*]" if logy else "set yrange [0:*]")
        plots = [f"'{base}-{s}.dat' using 1:{col} title '{SIDE_NAMES.get(s, s)}' noenhanced lw 2 pt 7 lc rgb '{colours.get(s, '#000000')}'" for s in sides]
        gp.append("plot " + ", ".join(plots))
    gp.append("unset multiplot")
    gnuplot_draw.draw(base, gp, [f"{base}-{side}.dat" for side in sides])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--raw", required=True)
    p.add_argument("--stale")
    p.add_argument("--header", default="")
    p.add_argument("--out")
    p.add_argument("--chart")
    p.add_argument("--chart-workload", default="b")
    p.add_argument("--chart-rtt", default="0.5")
    a = p.parse_args()
    if a.out:
        tables(a)
    if a.chart:
        chart(a)


if __name__ == "__main__":
    main()
