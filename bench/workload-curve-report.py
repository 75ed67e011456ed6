#!/usr/bin/env python3
"""bench/workload.sh curve: the tables and the chart from the raw CSVs.

--raw holds a row per (side, cell) of bench/clients/curve.py; --search
the cells of direct's saturation search. Writes --out (markdown): per RTT,
workload and N, the saturation rate S, a summary (warm-up, SLO throughput,
the figures at 50 % of S) and the cells of every side; for the chart's
cell, the issue's targets (#58) met or missed. --chart draws p99 against
offered load (gnuplot: a .gp file beside the PNG, removed after).
"""

import argparse
import csv
import os
import sys

import gnuplot_draw

NAMES = {"direct": "direct Redis", "sc-tcp": "sidecache (TCP)", "sc-unix": "sidecache (Unix socket)",
         "csc-py": "redis-py client-side cache"}
WORKLOADS = {"a": "YCSB A (50 % GET, 50 % SET)", "b": "YCSB B (95 % GET, 5 % SET)", "c": "YCSB C (GET only)",
             "f": "YCSB F (read-modify-write)", "session": "session store (HGETALL, HSET of 10 fields)"}
COLOURS = {"direct": "#555555", "sc-tcp": "#1f77b4", "sc-unix": "#17becf", "csc-py": "#d62728"}


def f(v, d=0):
    try:
        x = float(v)
    except (TypeError, ValueError):
        return "—"
    return f"{x:,.{d}f}"


def rtt_name(r):
    return "loopback" if float(r) == 0 else f"a {r} ms round trip"


def slo(rows, limit_us):
    """The highest offered rate of a run of cells from the lowest whose p99 held."""
    best = None
    for r in sorted(rows, key=lambda r: float(r["offered_per_s"])):
        if float(r["p99_us"]) > limit_us:
            break
        best = r
    return best


def at_half(rows, s):
    want = 0.5 * s
    near = [r for r in rows if abs(float(r["offered_per_s"]) - want) <= 0.02 * want + 1]
    return near[0] if near else None


def groups(raw):
    g = {}
    for r in raw:
        g.setdefault((r["rtt_ms"], r["workload"], r["procs"]), []).append(r)
    return g


def saturation(search, rtt, wl, n):
    for r in search:
        if r["rtt_ms"] == rtt and r["workload"] == wl and r["procs"] == n and float(r["p99_us"]) > 5000:
            return float(r["offered_per_s"])
    return None


def bytes_per_op(r):
    try:
        return float(r["redis_bytes_in_per_op"]) + float(r["redis_bytes_out_per_op"])
    except ValueError:
        return None


def ratio(x, y):
    return x / y if x is not None and y else None


def tables(a, raw, search):
    L = [a.header, ""]
    for (rtt, wl, n), rows in groups(raw).items():
        s = saturation(search, rtt, wl, n) or a.s
        sides = []
        for r in rows:
            if r["side"] not in sides:
                sides.append(r["side"])
        L.append(f"### {WORKLOADS.get(wl, wl)}, {rtt_name(rtt)}, {n} workers")
        L.append("")
        L.append(f"Direct Redis's p99 passed 5 ms at {f(s)} operations/s offered (S). SLO throughput: the highest "
                 "offered rate, of the cells run, at which the side's p99 held.")
        L.append("")
        L.append("| side | warm-up s (hit ratio) | SLO throughput, p99 ≤ 2 ms | p99 ≤ 5 ms | at 50 % of S: p50 / p99 / p99.9 µs | hit ratio | Redis CPU µs/op | bytes to+from Redis per op | host CPU µs/op (sidecache's) |")
        L.append("|---|---|---:|---:|---|---:|---:|---:|---|")
        for side in sides:
            sr = [r for r in rows if r["side"] == side]
            s2, s5, h = slo(sr, 2000), slo(sr, 5000), at_half(sr, s) if s else None
            warm = f"{f(sr[0]['warm_secs'], 1)} ({f(sr[0]['warm_hit_ratio'], 3)})" if sr[0]["warm_hit_ratio"] else "—"
            half = (f"{f(h['p50_us'])} / {f(h['p99_us'])} / {f(h['p999_us'])}", f(h["hit_ratio"], 3),
                    f(h["redis_cpu_us_per_op"], 2), f(bytes_per_op(h), 0),
                    f(h["host_cpu_us_per_op"], 1) + (f" ({f(h['sidecache_cpu_us_per_op'], 1)})" if h["sidecache_cpu_us_per_op"] else "")) if h else ("—",) * 5
            L.append(f"| {NAMES.get(side, side)} | {warm} | {f(s2['offered_per_s']) if s2 else '—'} | "
                     f"{f(s5['offered_per_s']) if s5 else '—'} | " + " | ".join(half) + " |")
        L.append("")
        if (rtt, wl, n) == (a.chart_rtt, a.chart_workload, a.chart_n) and s:
            L += targets(rows, s)
        L.append("<details><summary>every cell</summary>")
        L.append("")
        L.append("| side | offered/s | % of S | served/s | p50 µs | p99 µs | p99.9 µs | errors | hit ratio | Redis cmds/op | Redis CPU µs/op | bytes in / out per op | host CPU µs/op | sidecache CPU µs/op | load avg |")
        L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|")
        for r in rows:
            L.append(f"| {NAMES.get(r['side'], r['side'])} | {f(r['offered_per_s'])} | {f(100 * float(r['offered_per_s']) / s) if s else '—'} | "
                     f"{f(r['ops_per_s'])} | {f(r['p50_us'])} | {f(r['p99_us'])} | {f(r['p999_us'])} | {r['errors']} | "
                     f"{f(r['hit_ratio'], 3)} | {f(r['redis_cmds_per_op'], 3)} | {f(r['redis_cpu_us_per_op'], 2)} | "
                     f"{f(r['redis_bytes_in_per_op'])} / {f(r['redis_bytes_out_per_op'])} | {f(r['host_cpu_us_per_op'], 1)} | "
                     f"{f(r['sidecache_cpu_us_per_op'], 1)} | {r['load_avg']} |")
        L.append("")
        L.append("</details>")
        L.append("")
    open(a.out, "w").write("\n".join(L) + "\n")


def targets(rows, s):
    def side(name):
        return [r for r in rows if r["side"] == name]

    d = side("direct")
    dh = at_half(d, s)
    d2 = slo(d, 2000)
    out = ["Targets (issue #58), at 50 % of S:", ""]
    if not dh:
        return out + ["no direct cell at 50 % of S", ""]
    out.append("| | target | " + " | ".join(NAMES[x] for x in ("sc-tcp", "sc-unix") if side(x)) + " |")
    out.append("|---|---|" + "---|" * len([x for x in ("sc-tcp", "sc-unix") if side(x)]))
    checks = [
        ("p50 ÷ direct's", "≤ 0.25", lambda h, r: ratio(float(h["p50_us"]), float(dh["p50_us"])), 0.25),
        ("p99 ÷ direct's", "≤ 1.0", lambda h, r: ratio(float(h["p99_us"]), float(dh["p99_us"])), 1.0),
        ("SLO throughput (p99 ≤ 2 ms) ÷ direct's", "≥ 1.5",
         lambda h, r: ratio(float(slo(r, 2000)["offered_per_s"]) if slo(r, 2000) else 0.0,
                            float(d2["offered_per_s"]) if d2 else None), -1.5),
        ("Redis CPU per op ÷ direct's", "≤ 0.3",
         lambda h, r: ratio(float(h["redis_cpu_us_per_op"]), float(dh["redis_cpu_us_per_op"])), 0.3),
        ("bytes to+from Redis per op ÷ direct's", "≤ 0.3", lambda h, r: ratio(bytes_per_op(h), bytes_per_op(dh)), 0.3),
        ("(Redis commands per op ÷ direct's)", "—",
         lambda h, r: ratio(float(h["redis_cmds_per_op"]), float(dh["redis_cmds_per_op"])), None),
    ]
    csc = at_half(side("csc-py"), s)
    cr = sorted(side("csc-py"), key=lambda r: float(r["offered_per_s"]))
    if cr and not csc:
        last = cr[-1]
        out.insert(2, f"redis-py's client-side cache never reached 50 % of S: its p99 was {f(last['p99_us'])} µs at "
                      f"{f(last['offered_per_s'])} operations/s offered, where it stopped; at that rate, "
                      + ", ".join(f"{NAMES[x]} {f(r['p99_us'])} µs" for x in ("sc-tcp", "sc-unix")
                                  for r in side(x) if r["offered_per_s"] == last["offered_per_s"]) + ".")
        out.insert(3, "")
    if csc:
        checks.append(("p99 ÷ redis-py cache's", "≤ 1.0", lambda h, r: ratio(float(h["p99_us"]), float(csc["p99_us"])), 1.0))
    for label, want, fn, bound in checks:
        cells = []
        for x in ("sc-tcp", "sc-unix"):
            r = side(x)
            if not r:
                continue
            h = at_half(r, s)
            v = fn(h, r) if h else None
            if v is None:
                cells.append("—")
                continue
            if bound is None:
                cells.append(f"{v:.2f}")
                continue
            ok = v >= -bound if bound < 0 else v <= bound
            cells.append(f"{v:.2f} ({'met' if ok else 'missed'})")
        out.append(f"| {label} | {want} | " + " | ".join(cells) + " |")
    out.append("")
    return out


def chart(a, raw):
    rows = [r for r in raw if r["workload"] == a.chart_workload and r["rtt_ms"] == a.chart_rtt and r["procs"] == a.chart_n]
    if not rows:
        sys.exit(f"no rows for workload {a.chart_workload}, rtt {a.chart_rtt}, N {a.chart_n}")
    sides = []
    for r in rows:
        if r["side"] not in sides:
            sides.append(r["side"])
    base = os.path.splitext(a.chart)[0]
    for side in sides:
        with open(f"{base}-{side}.dat", "w") as fh:
            for r in sorted((r for r in rows if r["side"] == side), key=lambda r: float(r["offered_per_s"])):
                fh.write(f"{r['offered_per_s']} {max(float(r['p99_us']), 1) / 1000} {max(float(r['p50_us']), 1) / 1000}\n")
    title = f"{WORKLOADS.get(a.chart_workload, a.chart_workload)}, {rtt_name(a.chart_rtt)}, {a.chart_n} workers, warm; Zipf 0.99 over 10^6 keys of 1 KB"
    gp = ["set terminal pngcairo size 1000,600 font 'sans,10'", f"set output '{a.chart}'", f"set title \"{title}\"",
          "set key top left", "set grid", "set logscale y", "set xlabel 'offered load, operations per second'",
          "set ylabel 'latency, ms (from the intended send)'", "set style data linespoints", "set yrange [0.05:*]",
          "set arrow from graph 0, first 2 to graph 1, first 2 nohead dt 2 lc rgb '#999999'"]
    plots = []
    for s in sides:
        c = COLOURS.get(s, "#000000")
        plots.append(f"'{base}-{s}.dat' using 1:2 title '{NAMES.get(s, s)} p99' noenhanced lw 2 pt 7 lc rgb '{c}'")
        plots.append(f"'{base}-{s}.dat' using 1:3 title '{NAMES.get(s, s)} p50' noenhanced lw 1 dt 3 pt 6 lc rgb '{c}'")
    gp.append("plot " + ", ".join(plots))
    gnuplot_draw.draw(base, gp, [f"{base}-{s}.dat" for s in sides])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--raw", required=True)
    p.add_argument("--search", required=True)
    p.add_argument("--header", default="")
    p.add_argument("--out")
    p.add_argument("--chart")
    p.add_argument("--chart-workload", default="b")
    p.add_argument("--chart-rtt", default="0.5")
    p.add_argument("--chart-n", default="32")
    p.add_argument("--s", type=float, help="direct's saturation rate, where --search has none")
    a = p.parse_args()
    raw = list(csv.DictReader(open(a.raw)))
    search = list(csv.DictReader(open(a.search)))
    if a.out:
        tables(a, raw, search)
    if a.chart:
        chart(a, raw)


if __name__ == "__main__":
    main()
