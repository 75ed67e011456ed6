//! `latbench`: one load against a Redis-protocol server, with latencies in
//! a 1 µs histogram (redis-benchmark's buckets are ~8 µs wide at 25 µs).
//!
//! `--clients 1` runs on the calling thread with blocking sockets (nothing
//! between the reply's arrival and its timestamp but the kernel's wake-up);
//! more clients run as tasks of a one-thread tokio runtime. Each connection
//! sends `--pipeline` commands, reads all their replies, and records that
//! round trip. Only round trips that end inside the measured window (after
//! `--warmup`) count. Prints one CSV line:
//! `rps,p50_us,p99_us,mean_us,requests,errors,nils` (nils: GETs answered
//! `$-1`; MGET replies are not looked into).
//!
//! `--rate R` makes the load open: R round trips a second in all, each
//! connection with a sender thread sending at R / clients a second with
//! exponential gaps (Poisson arrivals), whatever the replies do, and a
//! reader thread counting every latency from the request's *intended*
//! send time, so a late send or a slow reply waits in the figure too (no
//! coordinated omission). The threads sleep
//! with a 1 ns timer slack (`/proc/TID/timerslack_ns`); a wake-up that
//! ends late counts in the figure (on the 2-core bench VM, 50–150 µs at
//! p50 against a loopback Redis; yielding instead of sleeping the last
//! 100 µs starved the threads at 50,000 a second). The CSV line then
//! ends with the p99.9 (`…,nils,p999_us`). Keys are redis-benchmark's:
//! `key:%012d` (`counter:%012d` for INCR), uniformly random in
//! `0..--keyspace`.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::BytesMut;
use clap::{Parser, ValueEnum};
use sidecache_bench::hist::Histogram;
use sidecache_resp::frame::Scanner;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Test {
    /// GET key:N.
    Get,
    /// SET key:N with a --data-size value.
    Set,
    /// INCR counter:N.
    Incr,
    /// MGET of 10 random keys.
    Mget,
}

#[derive(Parser, Debug)]
#[command(
    about = "One Redis load with 1 µs latency buckets; prints rps,p50_us,p99_us,mean_us,requests,errors,nils"
)]
struct Args {
    /// host:port to load.
    #[arg(long, default_value = "127.0.0.1:6379")]
    addr: String,
    /// A Unix socket to load instead of --addr.
    #[arg(long)]
    socket: Option<String>,
    /// The command.
    #[arg(long, value_enum, default_value_t = Test::Get)]
    test: Test,
    /// Connections.
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// Commands per round trip.
    #[arg(long, default_value_t = 1)]
    pipeline: usize,
    /// Seconds measured.
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    /// Seconds run before the measured window.
    #[arg(long, default_value_t = 0.2)]
    warmup: f64,
    /// Keys are random in 0..KEYSPACE.
    #[arg(long, default_value_t = 100_000)]
    keyspace: u64,
    /// SET value size in bytes.
    #[arg(long, default_value_t = 64)]
    data_size: usize,
    /// Write the histogram here (`us,count` lines).
    #[arg(long)]
    hist: Option<std::path::PathBuf>,
    /// Open loop: round trips per second in all (Poisson arrivals, latency
    /// from the intended send time; one thread per connection).
    #[arg(long)]
    rate: Option<f64>,
}

/// Builds the commands of one round trip.
struct Gen {
    test: Test,
    keyspace: u64,
    value: Vec<u8>,
    rng: u64,
}

impl Gen {
    fn next(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    fn key(&mut self) -> u64 {
        self.next() % self.keyspace
    }

    /// Uniform in (0, 1].
    fn uniform(&mut self) -> f64 {
        ((self.next() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    fn push(&mut self, out: &mut Vec<u8>) {
        // Keys are 16 bytes (`key:` + 12 digits); counters 20.
        match self.test {
            Test::Get => {
                let k = self.key();
                let _ = write!(out, "*2\r\n$3\r\nGET\r\n$16\r\nkey:{k:012}\r\n");
            }
            Test::Set => {
                let k = self.key();
                let _ = write!(
                    out,
                    "*3\r\n$3\r\nSET\r\n$16\r\nkey:{k:012}\r\n${}\r\n",
                    self.value.len()
                );
                out.extend_from_slice(&self.value);
                out.extend_from_slice(b"\r\n");
            }
            Test::Incr => {
                let k = self.key();
                let _ = write!(out, "*2\r\n$4\r\nINCR\r\n$20\r\ncounter:{k:012}\r\n");
            }
            Test::Mget => {
                out.extend_from_slice(b"*11\r\n$4\r\nMGET\r\n");
                for _ in 0..10 {
                    let k = self.key();
                    let _ = write!(out, "$16\r\nkey:{k:012}\r\n");
                }
            }
        }
    }
}

/// Counts of one connection (or all).
#[derive(Default)]
struct Tally {
    hist: Histogram,
    requests: u64,
    errors: u64,
    nils: u64,
}

impl Tally {
    fn merge(&mut self, o: &Tally) {
        self.hist.merge(&o.hist);
        self.requests += o.requests;
        self.errors += o.errors;
        self.nils += o.nils;
    }
}

/// Error and nil replies of one round trip.
#[derive(Default)]
struct Replies {
    errors: u64,
    nils: u64,
}

/// Checks one reply frame.
fn check(frame: &[u8], t: &mut Replies) {
    match frame.first() {
        Some(b'-') => t.errors += 1,
        Some(b'$') if frame.starts_with(b"$-1\r\n") => t.nils += 1,
        Some(b'_') => t.nils += 1,
        _ => {}
    }
}

/// Phases shared by the connections: 0 warm-up, 1 measured, 2 stop.
const WARM: u8 = 0;
const MEASURE: u8 = 1;
const STOP: u8 = 2;

fn main() -> Result<()> {
    let a = Args::parse();
    if a.clients == 0 || a.pipeline == 0 || a.keyspace == 0 {
        bail!("--clients, --pipeline and --keyspace must be positive");
    }
    let phase = Arc::new(AtomicU8::new(WARM));
    let window = Duration::from_secs_f64(a.seconds);
    let warm = Duration::from_secs_f64(a.warmup);
    let value = vec![b'x'; a.data_size];
    let gen = |i: u64| Gen {
        test: a.test,
        keyspace: a.keyspace,
        value: value.clone(),
        rng: (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ now_seed(),
    };
    let (tally, measured) = if let Some(rate) = a.rate {
        if !rate.is_finite() || rate <= 0.0 {
            bail!("--rate must be positive");
        }
        open_loop(&a, rate, &gen)?
    } else if a.clients == 1 {
        let start = Instant::now();
        let mut t = Tally::default();
        let mut g = gen(0);
        let stream: Box<dyn Stream> = match &a.socket {
            Some(p) => Box::new(
                std::os::unix::net::UnixStream::connect(p)
                    .with_context(|| format!("connecting {p}"))?,
            ),
            None => {
                let s = std::net::TcpStream::connect(&a.addr)
                    .with_context(|| format!("connecting {}", a.addr))?;
                s.set_nodelay(true)?;
                Box::new(s)
            }
        };
        let mut s = stream;
        let mut out = Vec::new();
        let mut buf = BytesMut::with_capacity(64 * 1024);
        let mut scanner = Scanner::new();
        let mut rd = vec![0u8; 64 * 1024];
        let mut measured_from = None;
        loop {
            let now = Instant::now();
            let in_window = match measured_from {
                None if now >= start + warm => {
                    measured_from = Some(now);
                    true
                }
                None => false,
                Some(m) if now >= m + window => break,
                Some(_) => true,
            };
            out.clear();
            for _ in 0..a.pipeline {
                g.push(&mut out);
            }
            let sent = Instant::now();
            s.write_all(&out)?;
            let scratch = read_replies(&mut *s, &mut buf, &mut scanner, &mut rd, a.pipeline)?;
            if in_window {
                t.hist.record(sent.elapsed());
                t.requests += a.pipeline as u64;
                t.errors += scratch.errors;
                t.nils += scratch.nils;
            }
        }
        let measured = measured_from.map_or(window, |m| m.elapsed());
        (t, measured)
    } else {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async {
            let mut tasks = Vec::new();
            for c in 0..a.clients {
                let (g, phase) = (gen(c as u64), Arc::clone(&phase));
                let (addr, socket, pipeline) = (a.addr.clone(), a.socket.clone(), a.pipeline);
                tasks.push(tokio::spawn(async move {
                    match socket {
                        Some(p) => {
                            let s = tokio::net::UnixStream::connect(&p).await?;
                            load(s, g, pipeline, &phase).await
                        }
                        None => {
                            let s = tokio::net::TcpStream::connect(&addr).await?;
                            s.set_nodelay(true)?;
                            load(s, g, pipeline, &phase).await
                        }
                    }
                }));
            }
            tokio::time::sleep(warm).await;
            phase.store(MEASURE, Ordering::Relaxed);
            let from = Instant::now();
            tokio::time::sleep(window).await;
            phase.store(STOP, Ordering::Relaxed);
            let measured = from.elapsed();
            let mut all = Tally::default();
            for t in tasks {
                all.merge(&t.await??);
            }
            Ok::<_, anyhow::Error>((all, measured))
        })?
    };
    let secs = measured.as_secs_f64();
    let h = &tally.hist;
    print!(
        "{:.0},{:.1},{:.1},{:.1},{},{},{}",
        tally.requests as f64 / secs,
        h.quantile_us(0.5),
        h.quantile_us(0.99),
        h.mean_us(),
        tally.requests,
        tally.errors,
        tally.nils
    );
    if a.rate.is_some() {
        print!(",{:.1}", h.quantile_us(0.999));
    }
    println!();
    if let Some(p) = &a.hist {
        let mut f = std::io::BufWriter::new(std::fs::File::create(p)?);
        writeln!(f, "us,count")?;
        for (us, n) in h.buckets() {
            writeln!(f, "{us},{n}")?;
        }
    }
    Ok(())
}

/// Reads `n` replies on a blocking stream (`buf` keeps what follows
/// them); their errors and nils.
fn read_replies(
    s: &mut dyn Stream,
    buf: &mut BytesMut,
    scanner: &mut Scanner,
    rd: &mut [u8],
    n: usize,
) -> Result<Replies> {
    let mut got = 0;
    let mut replies = Replies::default();
    while got < n {
        match scanner.scan(buf) {
            Ok(Some(len)) => {
                let f = buf.split_to(len);
                check(&f, &mut replies);
                got += 1;
                continue;
            }
            Ok(None) => {}
            Err(_) => bail!("bad RESP from the server"),
        }
        let read = s.read(rd)?;
        if read == 0 {
            bail!("connection closed");
        }
        buf.extend_from_slice(&rd[..read]);
    }
    Ok(replies)
}

/// The open-loop load (`--rate`): per connection, a sender thread that
/// sends every request due by the time it wakes (Poisson arrivals at
/// `rate / clients` a second), never waiting for replies, and a reader
/// thread that times each reply from its request's intended send time
/// (replies come in request order). Returns the merged tally and the
/// measured window.
fn open_loop(a: &Args, rate: f64, gen: &dyn Fn(u64) -> Gen) -> Result<(Tally, Duration)> {
    let start = Instant::now() + Duration::from_millis(50);
    let warm = Duration::from_secs_f64(a.warmup);
    let window = Duration::from_secs_f64(a.seconds);
    let (from, until) = (start + warm, start + warm + window);
    // Mean gap between one connection's sends, in seconds.
    let mean = a.clients as f64 / rate;
    let mut threads = Vec::new();
    for c in 0..a.clients {
        let mut g = gen(c as u64);
        let pipeline = a.pipeline;
        let (mut w, r): (Box<dyn Stream + Send>, Box<dyn Stream + Send>) = match &a.socket {
            Some(p) => {
                let s = std::os::unix::net::UnixStream::connect(p)?;
                (Box::new(s.try_clone()?), Box::new(s))
            }
            None => {
                let s = std::net::TcpStream::connect(&a.addr)?;
                s.set_nodelay(true)?;
                (Box::new(s.try_clone()?), Box::new(s))
            }
        };
        // Intended send times of the requests whose replies are due.
        let (tx, rx) = std::sync::mpsc::channel::<Instant>();
        let offset = Duration::from_secs_f64(mean * c as f64 / a.clients as f64);
        threads.push(std::thread::spawn(move || -> Result<Tally> {
            if let Some(tid) = sidecache_bench::relay::thread::thread_id() {
                sidecache_bench::relay::thread::set_timer_slack_1ns(tid);
            }
            // Connections start spread over one mean gap.
            let mut due = start + offset;
            let mut out = Vec::new();
            loop {
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                // Everything due by now, in one write.
                out.clear();
                let now = Instant::now();
                while due <= now && due < until {
                    for _ in 0..pipeline {
                        g.push(&mut out);
                    }
                    tx.send(due)?;
                    // Exponential gap: -ln(U) × mean, U in (0, 1].
                    due += Duration::from_secs_f64(-g.uniform().ln() * mean);
                }
                if !out.is_empty() {
                    w.write_all(&out)?;
                }
                if due >= until {
                    // The reader ends once the channel is empty and closed.
                    return Ok(Tally::default());
                }
            }
        }));
        threads.push(std::thread::spawn(move || -> Result<Tally> {
            let mut r = r;
            let mut t = Tally::default();
            let mut buf = BytesMut::with_capacity(64 * 1024);
            let mut scanner = Scanner::new();
            let mut rd = vec![0u8; 64 * 1024];
            while let Ok(sent) = rx.recv() {
                let scratch = read_replies(&mut *r, &mut buf, &mut scanner, &mut rd, pipeline)?;
                if sent >= from {
                    t.hist.record(sent.elapsed());
                    t.requests += pipeline as u64;
                    t.errors += scratch.errors;
                    t.nils += scratch.nils;
                }
            }
            Ok(t)
        }));
    }
    let mut all = Tally::default();
    for th in threads {
        let t = th
            .join()
            .map_err(|_| anyhow::anyhow!("a load thread panicked"))??;
        all.merge(&t);
    }
    Ok((all, window))
}

/// A seed from the clock, so two runs do not read the same key sequence.
fn now_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1
}

/// A blocking client socket.
trait Stream: Read + Write {}
impl Stream for std::net::TcpStream {}
impl Stream for std::os::unix::net::UnixStream {}

/// One connection of the many-client load, until the phase is `STOP`.
async fn load<S>(mut s: S, mut g: Gen, pipeline: usize, phase: &AtomicU8) -> Result<Tally>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut t = Tally::default();
    let mut out = Vec::new();
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut scanner = Scanner::new();
    loop {
        let at_start = phase.load(Ordering::Relaxed);
        if at_start == STOP {
            return Ok(t);
        }
        out.clear();
        for _ in 0..pipeline {
            g.push(&mut out);
        }
        let sent = Instant::now();
        s.write_all(&out).await?;
        let mut got = 0;
        let mut scratch = Replies::default();
        while got < pipeline {
            match scanner.scan(&buf) {
                Ok(Some(len)) => {
                    let f = buf.split_to(len);
                    check(&f, &mut scratch);
                    got += 1;
                    continue;
                }
                Ok(None) => {}
                Err(_) => bail!("bad RESP from the server"),
            }
            buf.reserve(16 * 1024);
            if s.read_buf(&mut buf).await? == 0 {
                bail!("connection closed");
            }
        }
        // Counted when it both started and ended in the measured window.
        if at_start == MEASURE && phase.load(Ordering::Relaxed) == MEASURE {
            t.hist.record(sent.elapsed());
            t.requests += pipeline as u64;
            t.errors += scratch.errors;
            t.nils += scratch.nils;
        }
    }
}
