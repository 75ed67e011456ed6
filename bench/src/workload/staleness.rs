//! `--staleness`: how long a write made directly to Redis takes to reach
//! readers through a cache, and the stale reads on the way.
//!
//! One writer connection (`--writer`, typically Redis itself) writes
//! `--hot-keys` keys in turn, `--writes` times, each value holding a
//! sequence number; `--readers` connections to the target poll, in a tight
//! loop (`GET`, one at a time), the key being written. After each
//! acknowledgement the writer waits until every reader has seen the new
//! value (at most `--max-wait-ms`), then pauses `--pause-ms`. Writer and
//! readers are OS threads with blocking sockets (timestamps taken as the
//! reply arrives, not when a runtime gets to it).
//!
//! Propagation, per write and reader: from the writer's acknowledgement to
//! the end of the reader's first read that returned the new value (0 when
//! the reader saw it before the acknowledgement arrived). A stale read: a
//! read that started after a later write of its key had been acknowledged,
//! yet returned an older sequence number (`stale_late`: started more than
//! `--deadline-ms` after that acknowledgement).
//!
//! Owns the probe and its line; shares only connections (`conn`) and the
//! RESP spelling of a bulk string (`command`) with the load.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use super::command::bulk;
use super::conn::Client;
use super::Common;
use crate::hist::Histogram;

/// Flags of `--staleness`.
#[derive(clap::Args, Debug, Clone)]
pub struct Options {
    /// Staleness: where the writer writes, host:port or unix:PATH [default: --target].
    #[arg(long)]
    pub writer: Option<String>,
    /// Staleness: reader connections to the target.
    #[arg(long, default_value_t = 2)]
    pub readers: usize,
    /// Staleness: writes.
    #[arg(long, default_value_t = 2000)]
    pub writes: u64,
    /// Staleness: keys written in turn.
    #[arg(long, default_value_t = 4)]
    pub hot_keys: u64,
    /// Staleness: pause after every reader saw a write, ms.
    #[arg(long, default_value_t = 2.0)]
    pub pause_ms: f64,
    /// Staleness: stale reads that start this long after the newer write's
    /// acknowledgement are counted as `stale_late`, ms.
    #[arg(long, default_value_t = 10.0)]
    pub deadline_ms: f64,
    /// Staleness: longest wait for every reader to see a write, ms.
    #[arg(long, default_value_t = 1000.0)]
    pub max_wait_ms: f64,
}

/// The sequence number at the start of a GET reply's value; `None` for a
/// nil, an error or anything else.
fn seq_of(frame: &[u8]) -> Option<u64> {
    let rest = frame.strip_prefix(b"$")?;
    let nl = rest.iter().position(|&b| b == b'\n')?;
    let payload = rest.get(nl + 1..)?;
    let digits = payload.iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(payload.get(..digits)?)
        .ok()?
        .parse()
        .ok()
}

/// What the writer publishes to the readers.
struct Shared {
    /// The write in progress (its key is the one to poll).
    current: AtomicU64,
    /// Per write: when it was acknowledged, ns since `origin` (MAX: not yet).
    acked_ns: Vec<AtomicU64>,
    /// Per hot key: its newest acknowledged write.
    key_acked: Vec<AtomicU64>,
    /// Per reader: the newest write it has seen.
    reader_seen: Vec<AtomicU64>,
    stop: AtomicBool,
    origin: Instant,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }
}

/// One reader's figures.
struct ReaderTally {
    /// Per write: the end of this reader's first read that returned it, ns
    /// (MAX: never).
    first_seen: Vec<u64>,
    reads: u64,
    stale: u64,
    stale_late: u64,
    backwards: u64,
    nils: u64,
    /// The readers' GET round trips.
    rtt: Histogram,
}

/// Runs the probe and prints its line: `writes readers samples p50_us
/// p99_us p999_us max_us mean_us unseen timeouts before_ack reads
/// stale_reads stale_late deadline_ms backwards nils write_p50_us
/// read_p50_us read_p99_us read_p999_us secs`.
///
/// # Errors
/// A flag out of range, a connection failing, a hot key that does not
/// read back as written, an error reply to the writer.
pub fn run(common: &Common, o: &Options) -> Result<()> {
    if o.readers == 0 || o.writes == 0 || o.hot_keys == 0 {
        bail!("--readers, --writes and --hot-keys must be positive");
    }
    let prefix = common.prefix.clone().unwrap_or_else(|| "wl:".to_owned());
    let keys: Vec<String> = (0..o.hot_keys)
        .map(|i| format!("{prefix}stale:{i}"))
        .collect();
    let value_of = |seq: u64| {
        let mut v = format!("{seq:012}:").into_bytes();
        let pad = common.value_size.saturating_sub(v.len());
        v.resize(v.len() + pad, b'x');
        v
    };
    let set = |k: &str, seq: u64| {
        let mut out = b"*3\r\n$3\r\nSET\r\n".to_vec();
        bulk(&mut out, k.as_bytes());
        bulk(&mut out, &value_of(seq));
        out
    };
    let get = |k: &str| {
        let mut out = b"*2\r\n$3\r\nGET\r\n".to_vec();
        bulk(&mut out, k.as_bytes());
        out
    };
    let gets: Vec<Vec<u8>> = keys.iter().map(|k| get(k)).collect();
    let writer_at = o.writer.clone().unwrap_or_else(|| common.target.clone());
    let mut w = Client::connect(&writer_at, None)?;
    for k in &keys {
        let r = w.call(&set(k, 0))?;
        if r.first() == Some(&b'-') {
            bail!("writer: {}", String::from_utf8_lossy(&r).trim_end());
        }
    }
    // Readers connect and read every hot key through the target, so each is
    // cached before the first write.
    let mut clients = Vec::new();
    for _ in 0..o.readers {
        let mut c = Client::connect(&common.target, common.unix.as_deref())?;
        for _ in 0..3 {
            for g in &gets {
                if seq_of(&c.call(g)?) != Some(0) {
                    bail!("reader: a hot key does not read back as written");
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        clients.push(c);
    }
    let n = o.writes as usize + 1;
    let sh = Arc::new(Shared {
        current: AtomicU64::new(0),
        acked_ns: (0..n).map(|_| AtomicU64::new(u64::MAX)).collect(),
        key_acked: (0..o.hot_keys).map(|_| AtomicU64::new(0)).collect(),
        reader_seen: (0..o.readers).map(|_| AtomicU64::new(0)).collect(),
        stop: AtomicBool::new(false),
        origin: Instant::now(),
    });
    sh.acked_ns[0].store(0, Ordering::Release);
    let deadline_ns = (o.deadline_ms * 1e6) as u64;
    let hot = o.hot_keys;
    let mut readers = Vec::new();
    for (r, mut c) in clients.into_iter().enumerate() {
        let (sh, gets) = (Arc::clone(&sh), gets.clone());
        readers.push(std::thread::spawn(move || -> Result<ReaderTally> {
            let mut t = ReaderTally {
                first_seen: vec![u64::MAX; n],
                reads: 0,
                stale: 0,
                stale_late: 0,
                backwards: 0,
                nils: 0,
                rtt: Histogram::new(),
            };
            let mut last = vec![0u64; hot as usize];
            while !sh.stop.load(Ordering::Acquire) {
                let k = (sh.current.load(Ordering::Acquire) % hot) as usize;
                let newest = sh.key_acked[k].load(Ordering::Acquire);
                let newest_at = sh.acked_ns[newest as usize].load(Ordering::Acquire);
                let start = sh.now_ns();
                let reply = c.call(&gets[k])?;
                let end = sh.now_ns();
                t.rtt
                    .record(Duration::from_nanos(end.saturating_sub(start)));
                t.reads += 1;
                let Some(seq) = seq_of(&reply) else {
                    t.nils += 1;
                    continue;
                };
                if seq < newest {
                    t.stale += 1;
                    if start.saturating_sub(newest_at) > deadline_ns {
                        t.stale_late += 1;
                    }
                }
                if seq < last[k] {
                    t.backwards += 1;
                }
                last[k] = last[k].max(seq);
                if let Some(f) = t.first_seen.get_mut(seq as usize) {
                    if *f == u64::MAX {
                        *f = end;
                    }
                }
                sh.reader_seen[r].fetch_max(seq, Ordering::AcqRel);
            }
            Ok(t)
        }));
    }
    let started = Instant::now();
    let mut write_hist = Histogram::new();
    let max_wait = Duration::from_secs_f64(o.max_wait_ms / 1e3);
    let pause = Duration::from_secs_f64(o.pause_ms / 1e3);
    let mut timeouts = 0u64;
    let mut failed = None;
    for seq in 1..=o.writes {
        let k = (seq % hot) as usize;
        sh.current.store(seq, Ordering::Release);
        let sent = Instant::now();
        let r = match w.call(&set(&keys[k], seq)) {
            Ok(r) => r,
            Err(e) => {
                failed = Some(e);
                break;
            }
        };
        let at = sh.now_ns();
        write_hist.record(sent.elapsed());
        if r.first() == Some(&b'-') {
            failed = Some(anyhow::anyhow!(
                "writer: {}",
                String::from_utf8_lossy(&r).trim_end()
            ));
            break;
        }
        sh.acked_ns[seq as usize].store(at, Ordering::Release);
        sh.key_acked[k].store(seq, Ordering::Release);
        let waiting = Instant::now();
        while sh
            .reader_seen
            .iter()
            .any(|s| s.load(Ordering::Acquire) < seq)
        {
            if waiting.elapsed() > max_wait {
                timeouts += 1;
                break;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        std::thread::sleep(pause);
    }
    sh.stop.store(true, Ordering::Release);
    let secs = started.elapsed().as_secs_f64();
    let mut tallies = Vec::new();
    for r in readers {
        match r.join() {
            Ok(t) => tallies.push(t?),
            Err(_) => bail!("a reader thread panicked"),
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    let mut hist = Histogram::new();
    let mut rtt = Histogram::new();
    let (mut max_ns, mut unseen, mut before_ack) = (0u64, 0u64, 0u64);
    let (mut reads, mut stale, mut stale_late, mut backwards, mut nils) = (0, 0, 0, 0, 0);
    for t in &tallies {
        for seq in 1..n {
            let seen = t.first_seen[seq];
            let acked = sh.acked_ns[seq].load(Ordering::Acquire);
            if seen == u64::MAX {
                unseen += 1;
                continue;
            }
            if seen < acked {
                before_ack += 1;
            }
            let d = seen.saturating_sub(acked);
            max_ns = max_ns.max(d);
            hist.record(Duration::from_nanos(d));
        }
        rtt.merge(&t.rtt);
        reads += t.reads;
        stale += t.stale;
        stale_late += t.stale_late;
        backwards += t.backwards;
        nils += t.nils;
    }
    println!(
        "writes={} readers={} samples={} p50_us={:.1} p99_us={:.1} p999_us={:.1} max_us={:.1} mean_us={:.1} unseen={unseen} timeouts={timeouts} before_ack={before_ack} reads={reads} stale_reads={stale} stale_late={stale_late} deadline_ms={} backwards={backwards} nils={nils} write_p50_us={:.1} read_p50_us={:.1} read_p99_us={:.1} read_p999_us={:.1} secs={secs:.3}",
        o.writes,
        o.readers,
        hist.count(),
        hist.quantile_us(0.5),
        hist.quantile_us(0.99),
        hist.quantile_us(0.999),
        max_ns as f64 / 1e3,
        hist.mean_us(),
        o.deadline_ms,
        write_hist.quantile_us(0.5),
        rtt.quantile_us(0.5),
        rtt.quantile_us(0.99),
        rtt.quantile_us(0.999),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_read_back() {
        assert_eq!(seq_of(b"$16\r\n000000000042:xxx\r\n"), Some(42));
        assert_eq!(seq_of(b"$-1\r\n"), None);
    }
}
