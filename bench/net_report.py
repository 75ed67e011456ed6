#!/usr/bin/env python3
"""bench/net.sh's report: medians over rounds of every (round trip,
clients, target, test), as markdown tables (one client: p50 / p99 µs; many
clients: requests/s and ratio to direct Redis), the issue's targets checked
at 0.5 ms, and a gnuplot chart.

Usage: net_report.py RAW.csv OUT.md HEADER MANY [OUT.png] [WORKDIR]
"""
import csv
import statistics
import subprocess
import sys
from collections import defaultdict

raw, out_md, header, many = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
out_png = sys.argv[5] if len(sys.argv) > 5 else ""
work = sys.argv[6] if len(sys.argv) > 6 else "/tmp"

runs = defaultdict(list)  # (rtt, clients, target, test) -> [row]
order_t, order_x, rtts = [], [], []
with open(raw) as f:
    for r in csv.DictReader(f):
        k = (r["rtt_ms"], int(r["clients"]), r["target"], r["test"])
        runs[k].append(r)
        for lst, v in ((order_t, r["target"]), (order_x, r["test"]), (rtts, r["rtt_ms"])):
            if v not in lst:
                lst.append(v)

# redis and twemproxy have no write-through mode: their set-wt cell is SET's.
SAME_AS = {"set-wt": "set"}


def med(rtt, clients, target, test, field):
    rows = runs.get((rtt, clients, target, test))
    if not rows and test in SAME_AS and not target.startswith(("sidecache", "baseline")):
        rows = runs.get((rtt, clients, target, SAME_AS[test]))
    # Fields older runs lack (or left empty, as a process with no part in
    # the target does) have no median.
    vals = [float(r[field]) for r in rows or [] if r.get(field)]
    return statistics.median(vals) if vals else None


def fmt_us(v):
    return "n/a" if v is None else (f"{v:.0f}" if v >= 100 else f"{v:.1f}")


def errors_note():
    bad = []
    for (rtt, c, t, x), rows in runs.items():
        e = sum(int(r["errors"]) for r in rows)
        if e:
            bad.append(f"{t} {x} c={c} rtt {rtt}: {e} error replies")
        nils = sum(int(r["nils"]) for r in rows)
        n = sum(int(r["requests"]) for r in rows)
        if x in ("get", "get-p16") and n and nils > n * 0.001:
            bad.append(f"{t} {x} c={c} rtt {rtt}: {nils} of {n} GETs were nil (not hits)")
    return bad


lines = [header, ""]
lines.append(
    "Every target pays the round trip to its Redis through bench's relay; sidecache and twemproxy "
    "run next to the client (loopback), as sidecars. Medians over the rounds; the target order "
    "rotates per round. set-wt: sidecache with `--write-mode write-through` (redis and twemproxy "
    "have no such mode: their SET figures again). `-p16`: 16 commands per round trip; its latency "
    "is the whole pipeline's."
)
lines.append("")
lines.append("### One client: p50 / p99 latency, µs (1 µs histogram)")
lines.append("")
lines.append("| test | RTT | " + " | ".join(order_t) + " |")
lines.append("|---|---:|" + "---:|" * len(order_t))
for x in order_x:
    for rtt in rtts:
        cells = []
        for t in order_t:
            p50, p99 = med(rtt, 1, t, x, "p50_us"), med(rtt, 1, t, x, "p99_us")
            cells.append(f"{fmt_us(p50)} / {fmt_us(p99)}")
        lines.append(f"| {x} | {rtt} ms | " + " | ".join(cells) + " |")
lines.append("")
lines.append(f"### {many} clients: requests/s (ratio to direct Redis)")
lines.append("")
lines.append("| test | RTT | " + " | ".join(order_t) + " |")
lines.append("|---|---:|" + "---:|" * len(order_t))
for x in order_x:
    for rtt in rtts:
        base = med(rtt, many, "redis", x, "rps")
        cells = []
        for t in order_t:
            v = med(rtt, many, t, x, "rps")
            if v is None:
                cells.append("n/a")
            elif t == "redis" or not base:
                cells.append(f"{v:.0f}")
            else:
                cells.append(f"{v:.0f} ({v / base:.2f}×)")
        lines.append(f"| {x} | {rtt} ms | " + " | ".join(cells) + " |")
lines.append("")


# Where the shared cores went at MANY clients: CPU per request of the relay
# (the stand-in network), the proxy and the Redis behind the target.
if any(r.get("relay_cpu_us") for rows in runs.values() for r in rows):
    lines.append(f"### {many} clients: CPU per request, µs: relay / proxy / Redis")
    lines.append("")
    lines.append(
        "utime + stime over each run (its warm-up included, counted at the measured rate), "
        "divided by its requests; `-` where a process has no part in the target. Hits cost "
        "the relay and Redis nothing; acknowledged SETs reach them in write-behind batches."
    )
    lines.append("")
    lines.append("| test | RTT | " + " | ".join(order_t) + " |")
    lines.append("|---|---:|" + "---:|" * len(order_t))

    def cpu(v):
        return "-" if v is None else f"{v:.1f}"

    for x in order_x:
        for rtt in rtts:
            cells = []
            for t in order_t:
                if not runs.get((rtt, many, t, x)):
                    cells.append("n/a")
                    continue
                f = [med(rtt, many, t, x, k) for k in ("relay_cpu_us", "proxy_cpu_us", "redis_cpu_us")]
                cells.append(" / ".join(cpu(v) for v in f))
            lines.append(f"| {x} | {rtt} ms | " + " | ".join(cells) + " |")
    lines.append("")

# The targets, at 0.5 ms.
if "0.5" in rtts:
    r = "0.5"
    chk = ["### Targets at 0.5 ms round trip", ""]

    def ok(b):
        return "met" if b else "NOT met"

    for t in [t for t in order_t if t.startswith("sidecache")]:
        g = med(r, 1, t, "get", "p50_us")
        s = med(r, 1, t, "set", "p50_us")
        if g is not None and s is not None:
            chk.append(f"- {t}: GET hit p50 {g:.1f} µs (≤ 25: {ok(g <= 25)}); write-behind SET p50 "
                       f"{s:.1f} µs (≤ 25: {ok(s <= 25)}; {s / g:.2f}× the GET hit, ≤ 1.2: {ok(s <= 1.2 * g)})")
        for x in ("get-miss", "incr", "set-wt"):
            v, d = med(r, 1, t, x, "p50_us"), med(r, 1, "redis", x, "p50_us")
            if v is not None and d is not None:
                chk.append(f"- {t}: {x} p50 {v:.1f} µs vs direct {d:.1f} µs: +{v - d:.1f} µs (≤ +40: {ok(v - d <= 40)})")
        for x in ("get", "set", "mget", "get-p16", "set-p16"):
            v, d = med(r, many, t, x, "rps"), med(r, many, "redis", x, "rps")
            one = med(r, 1, "redis", x, "p50_us")
            if v is not None and d:
                # What direct Redis could reach on any network: each client
                # has P commands out per round trip (the one-client p50).
                p = 16 if x.endswith("-p16") else 1
                bound = f"; the round trip bounds direct to {many * p / one * 1e6:.0f}/s, {v / (many * p / one * 1e6):.2f}× that" if one else ""
                chk.append(f"- {t}: {many} clients {x} {v:.0f}/s = {v / d:.2f}× direct ({d:.0f}/s; ≥ 10×: {ok(v >= 10 * d)}){bound}")
    lines += chk + [""]

notes = errors_note()
try:
    with open(f"{work}/exits.txt") as f:
        notes += [l.strip() + " (its later runs are left out)" for l in f if l.strip()]
except OSError:
    pass
if notes:
    lines += ["Warnings:", ""] + [f"- {n}" for n in notes] + [""]
with open(out_md, "w") as f:
    f.write("\n".join(lines))

if out_png:
    # Two panels at the middle round trip: one-client p50 per test, and
    # many-client throughput per test; log scales (they span 3 decades).
    rtt = "0.5" if "0.5" in rtts else rtts[len(rtts) // 2]
    dat = f"{work}/net-chart.dat"
    with open(dat, "w") as f:
        for x in order_x:
            p = [med(rtt, 1, t, x, "p50_us") for t in order_t]
            q = [med(rtt, many, t, x, "rps") for t in order_t]
            f.write(x + " " + " ".join("NaN" if v is None else f"{v:.1f}" for v in p + q) + "\n")
    n = len(order_t)
    gp = [
        "set terminal pngcairo size 1400,1000 font ',11' noenhanced",
        f"set output '{out_png}'",
        "set multiplot layout 2,1",
        "set style data histograms",
        "set style histogram clustered gap 1",
        "set style fill solid 0.85 border -1",
        "set boxwidth 0.9",
        "set logscale y",
        "set grid ytics mytics",
        "set key outside right top",
        "set xtics scale 0",
        f"set title 'One client, p50 latency at {rtt} ms round trip to Redis (µs, log scale; lower is better)'",
        "set ylabel 'p50 µs'",
        "plot " + ", ".join(f"'{dat}' using {i + 2}:xtic(1) title '{t}'" for i, t in enumerate(order_t)),
        f"set title '{many} clients, throughput at {rtt} ms round trip to Redis (requests/s, log scale; higher is better)'",
        "set ylabel 'requests/s'",
        "plot " + ", ".join(f"'{dat}' using {n + i + 2}:xtic(1) title '{t}'" for i, t in enumerate(order_t)),
        "unset multiplot",
    ]
    with open(f"{work}/net-chart.gp", "w") as f:
        f.write("\n".join(gp) + "\n")
    subprocess.run(["gnuplot", f"{work}/net-chart.gp"], check=False)
