//! `relay`: a TCP relay that adds a one-way delay each way (see
//! `sidecache_bench::relay`), or, with `--self-test`, measures the delay it
//! adds and the requests per second it carries, against an echo server of
//! its own.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use sidecache_bench::echo;
use sidecache_bench::hist::Histogram;
use sidecache_bench::relay::{DelayConfig, Relay, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Parser, Debug)]
#[command(about = "TCP relay adding a one-way delay per direction (or --self-test)")]
struct Args {
    /// LISTEN=CONNECT, e.g. 127.0.0.1:7000=127.0.0.1:6379, or
    /// 127.0.0.1:7000=unix:/run/redis.sock (repeatable).
    #[arg(long = "route")]
    routes: Vec<String>,
    /// One-way delay, client to upstream, µs.
    #[arg(long, default_value_t = 250)]
    delay_us: u64,
    /// One-way delay back, µs [default: --delay-us].
    #[arg(long)]
    delay_back_us: Option<u64>,
    /// Extra delay per chunk, uniform in 0..=JITTER µs (order is kept).
    #[arg(long, default_value_t = 0)]
    jitter_us: u64,
    /// The relay thread spins (instead of sleeping) this long before a
    /// deadline, µs.
    #[arg(long, default_value_t = 50)]
    spin_us: u64,
    /// Measure the added delay and the throughput instead of relaying.
    #[arg(long)]
    self_test: bool,
    /// Self-test: one-way delays to measure, µs.
    #[arg(long, value_delimiter = ',', default_value = "100,250,500,1000,2000")]
    test_delays_us: Vec<u64>,
    /// Self-test: round trips per delay (each through the relay and direct,
    /// alternating); 0 leaves the delay table out.
    #[arg(long, default_value_t = 3000)]
    samples: u64,
    /// Self-test: throughput connections.
    #[arg(long, default_value_t = 50)]
    clients: usize,
    /// Self-test: seconds per throughput run.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Self-test: throughput rows, `DELAY_US:P[:CLIENTS]` (P requests per
    /// round trip; CLIENTS connections, default --clients).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0:1,250:1,250:1:200,250:16,0:16"
    )]
    throughput: Vec<String>,
    /// Self-test: write the results (markdown) here too.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

fn main() -> Result<()> {
    let a = Args::parse();
    let cfg = DelayConfig {
        forward: Duration::from_micros(a.delay_us),
        back: Duration::from_micros(a.delay_back_us.unwrap_or(a.delay_us)),
        jitter: Duration::from_micros(a.jitter_us),
        spin: Duration::from_micros(a.spin_us),
    };
    if a.self_test {
        return self_test(&a, cfg);
    }
    if a.routes.is_empty() {
        bail!("no --route LISTEN=CONNECT given");
    }
    let mut routes = Vec::new();
    for r in &a.routes {
        let (l, c) = r
            .split_once('=')
            .with_context(|| format!("--route {r}: expected LISTEN=CONNECT"))?;
        let l: SocketAddr = l.parse().with_context(|| format!("--route {r}: listen"))?;
        let c: Upstream = c.parse().with_context(|| format!("--route {r}: connect"))?;
        routes.push((l, c));
    }
    let relay = Relay::start(&routes, cfg).context("starting the relay")?;
    for (addr, (_, c)) in relay.listen.iter().zip(&routes) {
        eprintln!(
            "relay {addr} -> {c}: +{} µs / +{} µs, jitter {} µs",
            a.delay_us,
            a.delay_back_us.unwrap_or(a.delay_us),
            a.jitter_us
        );
    }
    // Until killed (the bench scripts stop it by pid).
    loop {
        std::thread::park();
    }
}

const MSG: usize = 32;

fn ping(s: &mut TcpStream, buf: &mut [u8; MSG]) -> Result<Duration> {
    let t = Instant::now();
    s.write_all(&[b'p'; MSG])?;
    s.read_exact(buf)?;
    let d = t.elapsed();
    if buf.iter().any(|&b| b != b'p') {
        bail!("echo changed the bytes");
    }
    Ok(d)
}

fn self_test(a: &Args, base: DelayConfig) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("relay-self-test-{}", std::process::id()));
    let (echo, echo_unix) = (echo::tcp()?, echo::unix(&dir)?);
    let result = self_test_rows(a, base, echo, &echo_unix);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn self_test_rows(a: &Args, base: DelayConfig, echo: SocketAddr, echo_unix: &Path) -> Result<()> {
    let any: SocketAddr = "127.0.0.1:0".parse()?;
    let mut report = String::new();
    let mut line = |s: String| {
        println!("{s}");
        report.push_str(&s);
        report.push('\n');
    };
    line(format!(
        "Relay self-test ({}, {} CPUs): the same 32-byte ping-pong through the relay and \
         direct to an in-process echo server, alternating, {} round trips each; added one-way \
         delay = (round trip through the relay − direct round trip p50) / 2. Spin window {} µs, \
         jitter {} µs.",
        chrono_like_now(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        a.samples,
        base.spin.as_micros(),
        base.jitter.as_micros(),
    ));
    line(String::new());
    line("| one-way delay set | added p50 | added p99 | added mean | error of p50 | direct RTT p50 | late writes (mean / max) |".into());
    line("|---:|---:|---:|---:|---:|---:|---:|".into());
    for &d in a.test_delays_us.iter().filter(|_| a.samples > 0) {
        let cfg = DelayConfig {
            forward: Duration::from_micros(d),
            back: Duration::from_micros(d),
            ..base
        };
        let relay = Relay::start(&[(any, echo.into())], cfg)?;
        let mut via = TcpStream::connect(relay.listen[0])?;
        let mut direct = TcpStream::connect(echo)?;
        via.set_nodelay(true)?;
        direct.set_nodelay(true)?;
        let (mut hv, mut hd) = (Histogram::new(), Histogram::new());
        let mut buf = [0u8; MSG];
        for i in 0..a.samples + 100 {
            let dv = ping(&mut via, &mut buf)?;
            let dd = ping(&mut direct, &mut buf)?;
            if i >= 100 {
                hv.record(dv);
                hd.record(dd);
            }
        }
        let base_rtt = hd.quantile_us(0.5);
        let added = |q: f64| (hv.quantile_us(q) - base_rtt) / 2.0;
        let mean = (hv.mean_us() - hd.mean_us()) / 2.0;
        let chunks = relay.stats.chunks.load(Ordering::Relaxed).max(1);
        let late_mean = relay.stats.late_ns_sum.load(Ordering::Relaxed) as f64 / chunks as f64;
        let late_max = relay.stats.late_ns_max.load(Ordering::Relaxed) as f64;
        line(format!(
            "| {d} µs | {:.1} µs | {:.1} µs | {mean:.1} µs | {:+.1} µs | {base_rtt:.1} µs | {:.1} / {:.1} µs |",
            added(0.5),
            added(0.99),
            added(0.5) - d as f64,
            late_mean / 1000.0,
            late_max / 1000.0,
        ));
        if !relay.stats.slack_set.load(Ordering::Relaxed) {
            line("(timer slack of the relay thread could not be set to 1 ns)".into());
        }
    }
    line(String::new());
    line(format!(
        "Throughput: each connection sends P 32-byte requests per round trip and reads \
         their echo, {:.0} s per row; requests/s through the relay, with the echo server \
         reached over TCP and over a Unix socket, and, for reference, direct; the relay \
         thread's own CPU time per request (its schedstat); how late the relay wrote chunks \
         past their deadlines under that load. With C connections and a one-way delay D, \
         C / 2D bounds the rate (Little's law).",
        a.seconds
    ));
    line(String::new());
    line(
        "| one-way delay | P | connections | relay → TCP, req/s | relay CPU per req | relay → Unix, req/s | relay CPU per req | direct, req/s | late writes, TCP (mean / max) |"
            .into(),
    );
    line("|---:|---:|---:|---:|---:|---:|---:|---:|---:|".into());
    let mut rows = Vec::new();
    for r in &a.throughput {
        let f: Vec<&str> = r.split(':').collect();
        let num = |i: usize, dflt: u64| -> Result<u64> {
            f.get(i).map_or(Ok(dflt), |v| {
                v.parse()
                    .with_context(|| format!("--throughput {r}: expected DELAY_US:P[:CLIENTS]"))
            })
        };
        if !(2..=3).contains(&f.len()) {
            bail!("--throughput {r}: expected DELAY_US:P[:CLIENTS]");
        }
        let (d, p, c) = (num(0, 0)?, num(1, 1)?, num(2, a.clients as u64)?);
        rows.push((d, (p as usize).max(1), (c as usize).max(1)));
    }
    for (d, p, clients) in rows {
        let cfg = DelayConfig {
            forward: Duration::from_micros(d),
            back: Duration::from_micros(d),
            ..base
        };
        let (via, cpu, late_mean, late_max) =
            relayed(&(any, echo.into()), cfg, clients, p, a.seconds)?;
        let unix = Upstream::Unix(echo_unix.to_path_buf());
        let (via_unix, cpu_unix, _, _) = relayed(&(any, unix), cfg, clients, p, a.seconds)?;
        let (direct, _, _) = throughput(echo, clients, p, a.seconds, || None)?;
        line(format!(
            "| {d} µs | {p} | {clients} | {via:.0} | {cpu} | {via_unix:.0} | {cpu_unix} | {direct:.0} | {late_mean:.1} / {late_max:.1} µs |",
        ));
    }
    if let Some(out) = &a.out {
        std::fs::write(out, &report).with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}

/// A throughput run through a relay of `route`: requests/s, the relay
/// thread's CPU per request (µs, or "n/a"), and how late it wrote chunks
/// (mean and max, µs).
fn relayed(
    route: &(SocketAddr, Upstream),
    cfg: DelayConfig,
    clients: usize,
    p: usize,
    secs: f64,
) -> Result<(f64, String, f64, f64)> {
    let relay = Relay::start(std::slice::from_ref(route), cfg)?;
    let stats = Arc::clone(&relay.stats);
    let (rate, requests, cpu) =
        throughput(relay.listen[0], clients, p, secs, move || stats.cpu_time())?;
    let cpu = match cpu {
        Some(c) if requests > 0 => format!("{:.2} µs", c.as_secs_f64() * 1e6 / requests as f64),
        _ => "n/a".into(),
    };
    let chunks = relay.stats.chunks.load(Ordering::Relaxed).max(1);
    let late_mean = relay.stats.late_ns_sum.load(Ordering::Relaxed) as f64 / chunks as f64;
    let late_max = relay.stats.late_ns_max.load(Ordering::Relaxed) as f64;
    Ok((rate, cpu, late_mean / 1000.0, late_max / 1000.0))
}

/// The date and time now (UTC), from the system clock.
fn chrono_like_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60
    )
}

/// Requests per second that `clients` connections, each with `p` requests
/// out at a time, get from `addr` (an echo) in `secs`; the requests in that
/// window, and how far `clock` (a CPU-time probe) moved over it.
fn throughput(
    addr: SocketAddr,
    clients: usize,
    p: usize,
    secs: f64,
    clock: impl Fn() -> Option<Duration> + Send + 'static,
) -> Result<(f64, u64, Option<Duration>)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..clients {
            let (stop, done) = (Arc::clone(&stop), Arc::clone(&done));
            tasks.push(tokio::spawn(async move {
                let mut s = tokio::net::TcpStream::connect(addr).await?;
                s.set_nodelay(true)?;
                let out = vec![b'q'; MSG * p];
                let mut back = vec![0u8; MSG * p];
                while !stop.load(Ordering::Relaxed) {
                    s.write_all(&out).await?;
                    s.read_exact(&mut back).await?;
                    done.fetch_add(p as u64, Ordering::Relaxed);
                }
                Ok::<(), std::io::Error>(())
            }));
        }
        // A short warm-up, then the measured window.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let start = (Instant::now(), done.load(Ordering::Relaxed), clock());
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        let n = done.load(Ordering::Relaxed) - start.1;
        let cpu = start.2.zip(clock()).map(|(a, b)| b.saturating_sub(a));
        let rate = n as f64 / start.0.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await??;
        }
        Ok((rate, n, cpu))
    })
}
