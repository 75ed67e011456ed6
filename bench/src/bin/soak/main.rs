//! `soak`: the abuse soak of issue #21 (item 6), for `bench/soak.sh`.
//!
//! A normal workload (`--normal-clients` connections, each one GET or SET
//! of a small key per round trip) runs throughout. Its first window
//! (`--seconds`) has nothing else; then the abuse starts, side by side:
//!
//! - `--idle` connections held open, each sending an occasional `PING`;
//! - `--slow` readers, each pipelining `GET --slow-key` (a 1 MB value the
//!   script preloads) without end; even-numbered ones never read, odd ones
//!   read 16 KB every 100 ms;
//! - `--garbage` connections of each of three kinds, each sending, reading
//!   what comes back until the server closes or a short quiet timeout, and
//!   reconnecting: random bytes; valid commands cut short (closed at once or
//!   left waiting); `*1\r\n$536870912\r\n`-style headers of 512 MB bulks
//!   (and one past `--proto-max-bulk-len`'s default, and huge multibulk
//!   counts) followed by up to 256 KB of the payload;
//! - connect/close churn at `--churn-rate` per second (every tenth one
//!   sends a `PING` first).
//!
//! Once every idle connection is open (after at least `--ramp` seconds),
//! the second window (`--seconds`) measures the normal workload under the
//! abuse; a third (`--after`, optional) after the abuse stopped. The normal
//! workload and the abuse run on runtimes of their own (one thread each by
//! default), so the abuse cannot delay the normal clients inside this
//! process; they still share the machine's cores with the server.
//!
//! Prints `name=value` lines: per window `*_rps`, `*_p50_us`, `*_p99_us`,
//! `*_requests`, `*_errors`; then the abuse counters over the soak window.
//! `--idle-only SECS` opens the idle connections alone, prints
//! `idle_open=N` once they are, holds them SECS seconds and exits (how
//! `soak.sh` measures the constant of the bound).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use bytes::BytesMut;
use clap::Parser;
use sidecache_bench::hist::Histogram;
use sidecache_resp::frame::Scanner;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{watch, Semaphore};

mod load;
#[allow(clippy::wildcard_imports)]
use load::*;

#[derive(Parser, Debug, Clone)]
#[command(about = "Normal GET/SET load with and without an abuse mix; prints name=value lines")]
struct Args {
    /// host:port of the server.
    #[arg(long, default_value = "127.0.0.1:6380")]
    addr: String,
    /// Seconds of each measured window (baseline, soak).
    #[arg(long, default_value_t = 20.0)]
    seconds: f64,
    /// Seconds of normal load before the baseline window.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Least seconds between the abuse's start and the soak window (which
    /// also waits for every idle connection to be open, at most 30 s).
    #[arg(long, default_value_t = 3.0)]
    ramp: f64,
    /// Baseline + soak pairs, alternated (other load on a shared machine
    /// drifts; the ratio is over the pairs' totals).
    #[arg(long, default_value_t = 1)]
    cycles: usize,
    /// Seconds of a window after the abuse stopped (0: none).
    #[arg(long, default_value_t = 0.0)]
    after: f64,
    /// Normal workload connections (one request per round trip each).
    #[arg(long, default_value_t = 16)]
    normal_clients: usize,
    /// Normal workload keys: soak:n:0 .. soak:n:KEYSPACE-1.
    #[arg(long, default_value_t = 10_000)]
    keyspace: u64,
    /// Normal workload SET value size.
    #[arg(long, default_value_t = 64)]
    data_size: usize,
    /// Percentage of the normal requests that are SETs (the rest GETs).
    #[arg(long, default_value_t = 20)]
    set_percent: u64,
    /// Idle connections held open during the soak.
    #[arg(long, default_value_t = 1000)]
    idle: usize,
    /// Mean seconds between an idle connection's PINGs.
    #[arg(long, default_value_t = 5.0)]
    idle_ping_secs: f64,
    /// Slow readers.
    #[arg(long, default_value_t = 100)]
    slow: usize,
    /// The key slow readers GET (preloaded with a large value).
    #[arg(long, default_value = "soak:big")]
    slow_key: String,
    /// GETs per write of a slow reader.
    #[arg(long, default_value_t = 16)]
    slow_depth: usize,
    /// Connections of each garbage kind (random, truncated, bulk header).
    #[arg(long, default_value_t = 8)]
    garbage: usize,
    /// Connect/close churn, connections per second.
    #[arg(long, default_value_t = 5000)]
    churn_rate: u64,
    /// Most churn connections in flight at once (past it a tick's
    /// connections are skipped and counted).
    #[arg(long, default_value_t = 256)]
    churn_inflight: usize,
    /// Worker threads of the abuse's runtime.
    #[arg(long, default_value_t = 1)]
    abuse_threads: usize,
    /// Total requests per second of the normal workload, spread over its
    /// clients (each paces itself); 0: as fast as the replies come.
    #[arg(long, default_value_t = 0)]
    normal_rate: u64,
    /// Processes whose CPU time to report per window, as NAME=PID,…
    /// (this process's own threads are always reported).
    #[arg(long, default_value = "")]
    cpu_pids: String,
    /// Only open --idle connections, hold them this many seconds, exit.
    #[arg(long)]
    idle_only: Option<f64>,
}

// Phases of the normal workload; requests are counted in the window of the
// phase they started in.
const WARMUP: u8 = 0;
const BASELINE: u8 = 1;
const RAMP: u8 = 2;
const SOAK: u8 = 3;
const BETWEEN: u8 = 4;
const AFTER: u8 = 5;
const DONE: u8 = 6;

fn window(phase: u8) -> Option<usize> {
    match phase {
        BASELINE => Some(0),
        SOAK => Some(1),
        AFTER => Some(2),
        RAMP => Some(3),
        _ => None,
    }
}

/// xorshift64*: enough randomness for load, no dependency.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Rng((t ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    fn fill(&mut self, out: &mut Vec<u8>, n: usize) {
        while out.len() < n {
            let r = self.next().to_le_bytes();
            let take = (n - out.len()).min(8);
            out.extend_from_slice(&r[..take]);
        }
    }
}

fn command(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Counters shared by the tasks (the abuse's are snapshotted around the
/// soak window).
#[derive(Default)]
struct Counters {
    normal_ops: AtomicU64,
    normal_ok: AtomicU64,
    idle_open: AtomicU64,
    idle_connect_errors: AtomicU64,
    idle_pings: AtomicU64,
    idle_dropped: AtomicU64,
    slow_connected: AtomicU64,
    slow_gets_sent: AtomicU64,
    slow_bytes_read: AtomicU64,
    slow_errors: AtomicU64,
    garbage_conns: [AtomicU64; 3],
    garbage_bytes_sent: [AtomicU64; 3],
    garbage_bytes_received: [AtomicU64; 3],
    garbage_server_closed: [AtomicU64; 3],
    garbage_connect_errors: AtomicU64,
    churn_done: AtomicU64,
    churn_errors: AtomicU64,
    churn_skipped: AtomicU64,
}

const GARBAGE_KINDS: [&str; 3] = ["random", "truncated", "bulkhdr"];

/// Abuse counters at one moment.
#[derive(Clone, Copy, Default)]
struct Snapshot {
    churn_done: u64,
    churn_errors: u64,
    churn_skipped: u64,
    slow_gets_sent: u64,
    slow_bytes_read: u64,
    garbage_conns: [u64; 3],
    garbage_bytes_sent: [u64; 3],
    garbage_bytes_received: [u64; 3],
    garbage_server_closed: [u64; 3],
    idle_pings: u64,
}

impl Snapshot {
    /// `self` plus what changed from `a` to `b`.
    fn plus(&self, a: &Snapshot, b: &Snapshot) -> Snapshot {
        let v = |x: [u64; 3], y: [u64; 3], z: [u64; 3]| {
            [x[0] + z[0] - y[0], x[1] + z[1] - y[1], x[2] + z[2] - y[2]]
        };
        Snapshot {
            churn_done: self.churn_done + b.churn_done - a.churn_done,
            churn_errors: self.churn_errors + b.churn_errors - a.churn_errors,
            churn_skipped: self.churn_skipped + b.churn_skipped - a.churn_skipped,
            slow_gets_sent: self.slow_gets_sent + b.slow_gets_sent - a.slow_gets_sent,
            slow_bytes_read: self.slow_bytes_read + b.slow_bytes_read - a.slow_bytes_read,
            garbage_conns: v(self.garbage_conns, a.garbage_conns, b.garbage_conns),
            garbage_bytes_sent: v(
                self.garbage_bytes_sent,
                a.garbage_bytes_sent,
                b.garbage_bytes_sent,
            ),
            garbage_bytes_received: v(
                self.garbage_bytes_received,
                a.garbage_bytes_received,
                b.garbage_bytes_received,
            ),
            garbage_server_closed: v(
                self.garbage_server_closed,
                a.garbage_server_closed,
                b.garbage_server_closed,
            ),
            idle_pings: self.idle_pings + b.idle_pings - a.idle_pings,
        }
    }
}

impl Counters {
    fn snapshot(&self) -> Snapshot {
        let a = |x: &[AtomicU64; 3]| [x[0].load(Relaxed), x[1].load(Relaxed), x[2].load(Relaxed)];
        Snapshot {
            churn_done: self.churn_done.load(Relaxed),
            churn_errors: self.churn_errors.load(Relaxed),
            churn_skipped: self.churn_skipped.load(Relaxed),
            slow_gets_sent: self.slow_gets_sent.load(Relaxed),
            slow_bytes_read: self.slow_bytes_read.load(Relaxed),
            garbage_conns: a(&self.garbage_conns),
            garbage_bytes_sent: a(&self.garbage_bytes_sent),
            garbage_bytes_received: a(&self.garbage_bytes_received),
            garbage_server_closed: a(&self.garbage_server_closed),
            idle_pings: self.idle_pings.load(Relaxed),
        }
    }
}

/// CPU seconds (user + system) of `/proc/…/stat` at `path`, with the
/// name in its parentheses.
fn cpu_of(path: &std::path::Path) -> Option<(String, f64)> {
    let st = std::fs::read_to_string(path).ok()?;
    let (open, close) = (st.find('(')?, st.rfind(')')?);
    let name = st[open + 1..close].to_owned();
    let f: Vec<&str> = st[close + 1..].split_whitespace().collect();
    // Fields 14 and 15 of stat; `f[0]` is field 3. Clock ticks of 1/100 s.
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some((name, ticks as f64 / 100.0))
}

/// CPU seconds so far per process of `--cpu-pids` and per group of this
/// process's threads (`normal`, `abuse`, `other`).
fn cpu_now(pids: &[(String, u32)]) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = pids
        .iter()
        .map(|(n, p)| {
            let secs =
                cpu_of(std::path::Path::new(&format!("/proc/{p}/stat"))).map_or(0.0, |c| c.1);
            (n.clone(), secs)
        })
        .collect();
    let mut own = [
        ("load_normal", 0.0),
        ("load_abuse", 0.0),
        ("load_other", 0.0),
    ];
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for t in dir.flatten() {
            if let Some((name, secs)) = cpu_of(&t.path().join("stat")) {
                let g = match name.as_str() {
                    "normal" => 0,
                    "abuse" => 1,
                    _ => 2,
                };
                own[g].1 += secs;
            }
        }
    }
    out.extend(own.iter().map(|(n, s)| ((*n).to_owned(), *s)));
    // The whole machine (every process, other users' too): busy and, of
    // it, niced time, from /proc/stat's first line.
    let (mut busy, mut nice) = (0.0, 0.0);
    if let Ok(st) = std::fs::read_to_string("/proc/stat") {
        let f: Vec<f64> = st
            .lines()
            .next()
            .unwrap_or("")
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal
        if f.len() >= 8 {
            busy = (f[0] + f[1] + f[2] + f[5] + f[6] + f[7]) / 100.0;
            nice = f[1] / 100.0;
        }
    }
    out.push(("machine_busy".to_owned(), busy));
    out.push(("machine_niced".to_owned(), nice));
    out
}

fn epoch_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

fn runtime(threads: usize, name: &str) -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name(name)
        .enable_all()
        .build()?)
}

fn spawn_idle(
    rt: &tokio::runtime::Runtime,
    a: &Arc<Args>,
    stop: &watch::Receiver<bool>,
    k: &Arc<Counters>,
) {
    let gate = Arc::new(Semaphore::new(64));
    for i in 0..a.idle {
        rt.spawn(idle_conn(
            i,
            Arc::clone(a),
            stop.clone(),
            Arc::clone(k),
            Arc::clone(&gate),
        ));
    }
}

/// Waits until every idle connection is open, at most `most`.
fn wait_idle(a: &Args, k: &Counters, most: Duration) -> bool {
    let t = Instant::now();
    while (k.idle_open.load(Relaxed) as usize) < a.idle {
        if t.elapsed() > most {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

fn main() -> Result<()> {
    let a = Arc::new(Args::parse());
    let k = Arc::new(Counters::default());
    let abuse_rt = runtime(a.abuse_threads, "abuse")?;
    let (stop_tx, stop_rx) = watch::channel(false);

    if let Some(hold) = a.idle_only {
        spawn_idle(&abuse_rt, &a, &stop_rx, &k);
        let all = wait_idle(&a, &k, Duration::from_secs(30));
        println!("idle_open={}", k.idle_open.load(Relaxed));
        if !all {
            eprintln!("[soak] not every idle connection opened");
        }
        std::thread::sleep(Duration::from_secs_f64(hold));
        println!("idle_open_end={}", k.idle_open.load(Relaxed));
        let _ = stop_tx.send(true);
        abuse_rt.shutdown_timeout(Duration::from_secs(2));
        return Ok(());
    }

    let normal_rt = runtime(1, "normal")?;
    let phase = Arc::new(AtomicU8::new(WARMUP));
    let clients: Vec<_> = (0..a.normal_clients)
        .map(|c| {
            normal_rt.spawn(normal_client(
                c,
                Arc::clone(&a),
                Arc::clone(&phase),
                Arc::clone(&k),
            ))
        })
        .collect();

    // Progress, once a second, on stderr.
    let progress = {
        let (k, phase) = (Arc::clone(&k), Arc::clone(&phase));
        std::thread::spawn(move || {
            let t0 = Instant::now();
            let mut last = k.snapshot();
            let mut last_ops = 0;
            // The lowest one-second count of normal requests, per phase.
            let mut lowest = [u64::MAX; 7];
            while phase.load(Relaxed) < DONE {
                std::thread::sleep(Duration::from_secs(1));
                let now = k.snapshot();
                let ops = k.normal_ops.load(Relaxed);
                eprintln!(
                    "[soak] t={:>3.0}s phase={} normal={}/s idle_open={} churn={}/s (err {} skip {}) slow_read={}KB/s garbage={}/s",
                    t0.elapsed().as_secs_f64(),
                    phase.load(Relaxed),
                    ops - last_ops,
                    k.idle_open.load(Relaxed),
                    now.churn_done - last.churn_done,
                    now.churn_errors - last.churn_errors,
                    now.churn_skipped - last.churn_skipped,
                    (now.slow_bytes_read - last.slow_bytes_read) >> 10,
                    now.garbage_conns.iter().sum::<u64>() - last.garbage_conns.iter().sum::<u64>(),
                );
                let p = phase.load(Relaxed) as usize;
                if let Some(l) = lowest.get_mut(p) {
                    *l = (*l).min(ops - last_ops);
                }
                last = now;
                last_ops = ops;
            }
            lowest
        })
    };

    let secs = Duration::from_secs_f64(a.seconds);
    std::thread::sleep(Duration::from_secs_f64(a.warmup));
    let pids: Vec<(String, u32)> = a
        .cpu_pids
        .split(',')
        .filter_map(|kv| {
            let (n, p) = kv.split_once('=')?;
            Some((n.to_owned(), p.parse().ok()?))
        })
        .collect();
    // Per window (baseline, soak, after, ramp): time, CPU seconds by name.
    let mut spans = [Duration::ZERO; 4];
    let mut cpu: [Vec<(String, f64)>; 4] = Default::default();
    let add_cpu = |acc: &mut Vec<(String, f64)>, c0: &[(String, f64)], c1: &[(String, f64)]| {
        if acc.is_empty() {
            acc.extend(c0.iter().map(|(n, _)| (n.clone(), 0.0)));
        }
        for (i, (_, x1)) in c1.iter().enumerate() {
            acc[i].1 += x1 - c0[i].1;
        }
    };
    let mut marks = vec![("baseline_start".to_owned(), epoch_ms())];
    let mut diff = Snapshot::default();
    let mut all_idle = true;
    let (mut idle_at_start, mut idle_at_end) = (u64::MAX, u64::MAX);
    let mut cycle_rps = Vec::new();
    // One measured window of `phase`: its time and CPU go to `w`;
    // returns the normal requests answered in it.
    let measure = |phase_v: u8,
                   w: usize,
                   d: Duration,
                   spans: &mut [Duration; 4],
                   cpu: &mut [Vec<(String, f64)>; 4]| {
        let ok0 = k.normal_ok.load(Relaxed);
        let c0 = cpu_now(&pids);
        let t = Instant::now();
        phase.store(phase_v, Relaxed);
        std::thread::sleep(d);
        let span = t.elapsed();
        spans[w] += span;
        add_cpu(&mut cpu[w], &c0, &cpu_now(&pids));
        (k.normal_ok.load(Relaxed) - ok0) as f64 / span.as_secs_f64()
    };
    for cycle in 0..a.cycles.max(1) {
        let base_rps = measure(BASELINE, 0, secs, &mut spans, &mut cpu);
        // The abuse, side by side.
        marks.push((format!("abuse_start_c{cycle}"), epoch_ms()));
        let ramp_start = Instant::now();
        let ramp_c0 = cpu_now(&pids);
        let ramp_ok0 = k.normal_ok.load(Relaxed);
        phase.store(RAMP, Relaxed);
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut tasks = Vec::new();
        let gate = Arc::new(Semaphore::new(64));
        for i in 0..a.idle {
            tasks.push(abuse_rt.spawn(idle_conn(
                i,
                Arc::clone(&a),
                stop_rx.clone(),
                Arc::clone(&k),
                Arc::clone(&gate),
            )));
        }
        for i in 0..a.slow {
            tasks.push(abuse_rt.spawn(slow_reader(
                i,
                Arc::clone(&a),
                stop_rx.clone(),
                Arc::clone(&k),
            )));
        }
        for kind in 0..GARBAGE_KINDS.len() {
            for i in 0..a.garbage {
                tasks.push(abuse_rt.spawn(garbage(
                    kind,
                    i,
                    Arc::clone(&a),
                    stop_rx.clone(),
                    Arc::clone(&k),
                )));
            }
        }
        tasks.push(abuse_rt.spawn(churn(Arc::clone(&a), stop_rx.clone(), Arc::clone(&k))));
        all_idle &= wait_idle(&a, &k, Duration::from_secs(30));
        let ramp = Duration::from_secs_f64(a.ramp);
        if let Some(rest) = ramp.checked_sub(ramp_start.elapsed()) {
            std::thread::sleep(rest);
        }
        let ramp_span = ramp_start.elapsed();
        spans[3] += ramp_span;
        add_cpu(&mut cpu[3], &ramp_c0, &cpu_now(&pids));
        let ramp_rps = (k.normal_ok.load(Relaxed) - ramp_ok0) as f64 / ramp_span.as_secs_f64();
        let s0 = k.snapshot();
        idle_at_start = idle_at_start.min(k.idle_open.load(Relaxed));
        let soak_rps = measure(SOAK, 1, secs, &mut spans, &mut cpu);
        let s1 = k.snapshot();
        idle_at_end = idle_at_end.min(k.idle_open.load(Relaxed));
        diff = diff.plus(&s0, &s1);
        phase.store(BETWEEN, Relaxed);
        marks.push((format!("soak_end_c{cycle}"), epoch_ms()));
        let _ = stop_tx.send(true);
        abuse_rt.block_on(async {
            for t in tasks {
                let _ = tokio::time::timeout(Duration::from_secs(3), t).await;
            }
        });
        cycle_rps.push((base_rps, ramp_rps, soak_rps));
        // Let the server close what the abuse left before the next window.
        std::thread::sleep(Duration::from_millis(500));
    }
    if a.after > 0.0 {
        measure(
            AFTER,
            2,
            Duration::from_secs_f64(a.after),
            &mut spans,
            &mut cpu,
        );
    }
    phase.store(DONE, Relaxed);
    let mut total: [Stats; 4] = Default::default();
    normal_rt.block_on(async {
        for c in clients {
            if let Ok(st) = c.await {
                for (t, s) in total.iter_mut().zip(st.iter()) {
                    t.hist.merge(&s.hist);
                    t.errors += s.errors;
                }
            }
        }
    });
    let lowest = progress.join().unwrap_or([u64::MAX; 7]);

    for (w, name) in ["baseline", "soak", "after", "ramp"].iter().enumerate() {
        if spans[w].is_zero() {
            continue;
        }
        let st = &total[w];
        println!("{name}_secs={:.2}", spans[w].as_secs_f64());
        println!("{name}_requests={}", st.hist.count());
        println!(
            "{name}_rps={:.0}",
            st.hist.count() as f64 / spans[w].as_secs_f64()
        );
        println!("{name}_p50_us={:.1}", st.hist.quantile_us(0.5));
        println!("{name}_p99_us={:.1}", st.hist.quantile_us(0.99));
        println!("{name}_p999_us={:.1}", st.hist.quantile_us(0.999));
        println!("{name}_max_us={:.1}", st.hist.quantile_us(1.0));
        println!("{name}_errors={}", st.errors);
        let p = [BASELINE, SOAK, AFTER, RAMP][w] as usize;
        if lowest[p] != u64::MAX {
            println!("{name}_lowest_1s={}", lowest[p]);
        }
        // Percent of one core over the window.
        for (n, secs) in &cpu[w] {
            let pct = secs / spans[w].as_secs_f64() * 100.0;
            println!("{name}_cpu_{n}_pct={pct:.0}");
        }
    }
    for (name, ms) in &marks {
        println!("mark_{name}_ms={ms}");
    }
    for (c, (b, r, so)) in cycle_rps.iter().enumerate() {
        println!(
            "cycle_{c}=baseline {b:.0} ramp {r:.0} soak {so:.0} ratio {:.2}",
            if *b > 0.0 { so / b } else { 0.0 }
        );
    }
    let soak = spans[1].as_secs_f64();
    let d = &diff;
    println!("idle_all_open={all_idle}");
    println!("idle_open_soak_start={idle_at_start}");
    println!("idle_open_soak_end={idle_at_end}");
    println!(
        "idle_connect_errors={}",
        k.idle_connect_errors.load(Relaxed)
    );
    println!("idle_dropped={}", k.idle_dropped.load(Relaxed));
    println!("idle_pings_soak={}", d.idle_pings);
    println!("slow_connections={}", k.slow_connected.load(Relaxed));
    println!("slow_errors={}", k.slow_errors.load(Relaxed));
    println!("slow_gets_sent_soak={}", d.slow_gets_sent);
    println!("slow_bytes_read_soak={}", d.slow_bytes_read);
    for (g, name) in GARBAGE_KINDS.iter().enumerate() {
        println!("garbage_{name}_conns_soak={}", d.garbage_conns[g]);
        println!("garbage_{name}_bytes_sent_soak={}", d.garbage_bytes_sent[g]);
        println!(
            "garbage_{name}_bytes_received_soak={}",
            d.garbage_bytes_received[g]
        );
        println!(
            "garbage_{name}_server_closed_soak={}",
            d.garbage_server_closed[g]
        );
    }
    println!(
        "garbage_connect_errors={}",
        k.garbage_connect_errors.load(Relaxed)
    );
    println!("churn_target_per_s={}", a.churn_rate);
    println!("churn_done_soak={}", d.churn_done);
    println!("churn_per_s={:.0}", d.churn_done as f64 / soak);
    println!("churn_errors_soak={}", d.churn_errors);
    println!("churn_skipped_soak={}", d.churn_skipped);
    Ok(())
}
