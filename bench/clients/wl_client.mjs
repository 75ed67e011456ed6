// bench/workload.sh sides: one worker process of an application, in
// node-redis (pinned in package.json). The same modes, workloads, key
// names, Zipf draw and output files as wl_client.py (its docstring is the
// reference); node processes are spawned one per worker by the script
// (--proc-index), each with one connection and, with --csc, its own
// client-side cache (`clientSideCache`, RESP3, CLIENT TRACKING in default
// mode; works on Redis 7.0). Owns only the client's loop.
//
//   node wl_client.mjs load|stale-reader|stale-writer --proc-index I [flags of wl_client.py]

import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { createClient } from "redis";

const SPAN_US = 100000;
const MAGIC = "sidecache-bench workload report 1";
const HASH_FIELDS = 10;

const mode = process.argv[2];
const a = {
  target: "127.0.0.1:6379", unix: "", csc: false, "csc-max-entries": 10000, "proc-index": 0,
  workload: "b", keys: 1000000, "zipf-s": 0.99, "value-size": 1024, "session-write-pct": 20,
  "start-at": 0, "warm-secs": 1, secs: 2, "tail-secs": 0.5, seed: 0, "hist-dir": ".", key: "wlstale:0",
  "until-ms": 0, "poll-us": 200, "out-dir": ".", writes: 40, "pause-ms": 25, out: "writes.txt",
};
for (let i = 3; i < process.argv.length; i++) {
  const k = process.argv[i].replace(/^--/, "");
  if (!(k in a)) throw new Error(`unknown flag --${k}`);
  if (typeof a[k] === "boolean") a[k] = true;
  else a[k] = typeof a[k] === "number" ? Number(process.argv[++i]) : process.argv[++i];
}

// splitmix64 on BigInt would be slow; mulberry32 seeded per worker is enough to pick keys.
function rng(seed) {
  let t = seed >>> 0;
  return () => {
    t = (t + 0x6d2b79f5) >>> 0;
    let x = Math.imul(t ^ (t >>> 15), t | 1);
    x ^= x + Math.imul(x ^ (x >>> 7), x | 61);
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
  };
}

// Rejection-inversion Zipf, as wl_client.py's.
function zipf(n, s, rand) {
  const h = (x) => Math.exp(-s * Math.log(x));
  const h1 = (x) => (Math.abs(x) > 1e-8 ? Math.log1p(x) / x : 1 - x * (0.5 - x * (1 / 3 - 0.25 * x)));
  const h2 = (x) => (Math.abs(x) > 1e-8 ? Math.expm1(x) / x : 1 + x * 0.5 * (1 + x * (1 / 3) * (1 + 0.25 * x)));
  const hi = (x) => { const lx = Math.log(x); return h2((1 - s) * lx) * lx; };
  const hii = (x) => Math.exp(h1(Math.max(x * (1 - s), -1)) * x);
  const hx1 = hi(1.5) - 1, hn = hi(n + 0.5), cut = 2 - hii(hi(2.5) - h(2));
  return () => {
    for (;;) {
      const u = hn + rand() * (hx1 - hn);
      const x = hii(u);
      const k = Math.min(Math.max(Math.floor(x + 0.5), 1), n);
      if (k - x <= cut || u >= hi(k + 0.5) - h(k)) return k - 1;
    }
  };
}

async function connect() {
  const opts = { socket: a.unix ? { path: a.unix } : { host: a.target.split(":")[0], port: Number(a.target.split(":")[1]) } };
  if (a.csc) Object.assign(opts, { RESP: 3, clientSideCache: { ttl: 0, maxEntries: a["csc-max-entries"], evictPolicy: "LRU" } });
  const c = createClient(opts);
  c.on("error", (e) => console.error(`wl_client.mjs: ${e}`));
  await c.connect();
  await c.ping();
  return c;
}

// Wall clock with sub-millisecond precision, ns (Date.now() is in ms).
const wallNs = () => BigInt(Math.round((performance.timeOrigin + performance.now()) * 1e6));
const sleep = (ms) => new Promise((r) => setTimeout(r, Math.max(ms, 0)));
const idx = a["proc-index"];

async function load() {
  const c = await connect();
  const rand = rng((a.seed || Date.now()) ^ Math.imul(idx + 1, 0x9e3779b1));
  const draw = zipf(a.keys, a["zipf-s"], rand);
  const wl = a.workload;
  const val = "x".repeat(a["value-size"]);
  const fieldVal = "y".repeat(Math.max(Math.floor(a["value-size"] / HASH_FIELDS), 1));
  const fields = {};
  for (let i = 0; i < HASH_FIELDS; i++) fields[`f${i}`] = fieldVal;
  const wpct = { a: 50, b: 5, c: 0, f: 50, session: a["session-write-pct"] }[wl] / 100;
  const prefix = wl === "session" ? "wlh:" : "wl:";
  const late = Date.now() - a["start-at"];
  await sleep(a["start-at"] - Date.now());
  const tMeas = a["start-at"] + a["warm-secs"] * 1000, tEnd = tMeas + a.secs * 1000, tStop = tEnd + a["tail-secs"] * 1000;
  const buckets = new Map();
  let count = 0, sumNs = 0n, over = 0, overMax = 0;
  let reads = 0, writes = 0, readCmds = 0, writeCmds = 0, errors = 0;
  let measuring = false, done = false, startNs = 0n, t0 = 0n, lastEnd = 0n;
  for (;;) {
    const now = Date.now();
    if (!measuring && !done && now >= tMeas) { measuring = true; startNs = wallNs(); t0 = process.hrtime.bigint(); }
    if (now >= tStop) break;
    if (measuring && now >= tEnd) { measuring = false; done = true; }
    const key = prefix + String(draw()).padStart(8, "0");
    const w = rand() < wpct;
    const t = process.hrtime.bigint();
    try {
      if (wl === "session") {
        if (w) await c.hSet(key, fields); else await c.hGetAll(key);
      } else if (w && wl === "f") {
        const v = (await c.get(key)) ?? val;
        await c.set(key, v.slice(0, -1) + String(Math.floor(rand() * 10)));
      } else if (w) await c.set(key, val);
      else await c.get(key);
    } catch (e) {
      if (errors === 0) console.error(`wl_client.mjs: ${e}`);
      errors++;
    }
    if (measuring) {
      lastEnd = process.hrtime.bigint();
      const ns = lastEnd - t;
      const us = Number(ns / 1000n);
      if (us < SPAN_US) buckets.set(us, (buckets.get(us) ?? 0) + 1);
      else { over++; overMax = Math.max(overMax, us); }
      count++; sumNs += ns;
      if (w) { writes++; writeCmds++; if (wl === "f") readCmds++; } else { reads++; readCmds++; }
    }
  }
  const secs = done ? Number(lastEnd - t0) / 1e9 : 0;
  const lines = [MAGIC, `start_unix_ns=${startNs} secs=${secs} reads=${reads} writes=${writes} errors=${errors} nils=0 backwards=0`,
    `count=${count} sum_ns=${sumNs} over=${over} over_max_us=${overMax}`];
  for (const [us, n] of [...buckets].sort((x, y) => x[0] - y[0])) lines.push(`${us} ${n}`);
  writeFileSync(join(a["hist-dir"], `proc-${idx}.hist`), lines.join("\n") + "\n");
  let hits = "";
  if (a.csc) { const st = c.clientSideCache.stats(); hits = ` csc_hits=${st.hitCount} csc_misses=${st.missCount}`; }
  writeFileSync(join(a["hist-dir"], `proc-${idx}.extra`), `read_cmds=${readCmds} write_cmds=${writeCmds} late_ms=${Math.max(late, 0)}${hits}\n`);
  await c.close?.() ?? c.quit();
}

async function reader() {
  const c = await connect();
  const out = [];
  let last = undefined;
  await sleep(a["start-at"] - Date.now());
  while (Date.now() < a["until-ms"]) {
    const v = await c.get(a.key);
    const t = wallNs();
    if (v !== last) { last = v; out.push(`${v ? Number(v) : 0} ${t}`); }
    // Timers are whole milliseconds: a node reader polls about every 1 ms.
    if (a["poll-us"] > 0) await sleep(a["poll-us"] / 1000);
  }
  writeFileSync(join(a["out-dir"], `reader-${idx}.txt`), out.join("\n") + "\n");
  await c.close?.() ?? c.quit();
}

async function writer() {
  const c = await connect();
  await c.set(a.key, "0");
  await sleep(a["start-at"] - Date.now());
  const out = [];
  for (let i = 1; i <= a.writes; i++) {
    await c.set(a.key, String(i));
    out.push(`${i} ${wallNs()}`);
    await sleep(a["pause-ms"]);
  }
  writeFileSync(a.out, out.join("\n") + "\n");
  await c.close?.() ?? c.quit();
}

const run = { load, "stale-reader": reader, "stale-writer": writer }[mode];
if (!run) { console.error("usage: node wl_client.mjs load|stale-reader|stale-writer [flags]"); process.exit(2); }
run().then(() => process.exit(0), (e) => { console.error(`wl_client.mjs: ${e.stack ?? e}`); process.exit(1); });
