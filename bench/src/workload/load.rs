//! The mixed load: `--conns` connections (tokio tasks, each its own
//! connection), each sending `--pipeline` operations per round trip until
//! `--ops` operations were sent in all (or for `--secs`); each operation a
//! write with probability `--write-pct` %, a read otherwise, of a key
//! drawn by `keys`. Owns the operation source of a connection (with the
//! `--check-values` bookkeeping), the budget shared by the connections and
//! the run; the commands are `command`'s and the figures `report`'s.
//!
//! Several processes can share one load (`--procs`, `--proc-index`):
//! each numbers its connections after the previous processes' ones, so
//! that key draws differ and each key keeps one `--check-values` writer,
//! and `--start-at` makes them start together.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use bytes::BytesMut;
use sidecache_resp::frame::Scanner;
use tokio::io::AsyncWriteExt;

use super::command::{Cfg, Kind, HASH_FIELDS};
use super::conn::{connect, read_frame, Io};
use super::keys::{Dist, Rng, Sampler};
use super::report::{Report, Tally};
use super::{populate, Common};

/// Flags of the load.
#[derive(clap::Args, Debug, Clone)]
pub struct Options {
    /// Connections (each a task of its own).
    #[arg(long, default_value_t = 4)]
    pub conns: usize,
    /// Keys in the key space.
    #[arg(long, default_value_t = 10_000)]
    pub keys: u64,
    /// Key popularity.
    #[arg(long, value_enum, default_value_t = Dist::Zipf)]
    pub dist: Dist,
    /// Zipf exponent.
    #[arg(long, default_value_t = 0.99)]
    pub zipf_s: f64,
    /// Percentage of operations that are writes.
    #[arg(long, default_value_t = 20.0)]
    pub write_pct: f64,
    /// Operations in all (0 with --populate: populate only).
    #[arg(long, default_value_t = 80_000)]
    pub ops: u64,
    /// Run this many seconds instead of --ops operations.
    #[arg(long)]
    pub secs: Option<f64>,
    /// Value type.
    #[arg(long = "type", value_enum, default_value_t = Kind::String)]
    pub kind: Kind,
    /// Operations per round trip.
    #[arg(long, default_value_t = 1)]
    pub pipeline: usize,
    /// Write every key first.
    #[arg(long)]
    pub populate: bool,
    /// Commands per pipelined batch while populating.
    #[arg(long, default_value_t = 1000)]
    pub populate_batch: usize,
    /// Versioned values; count reads that went backwards.
    #[arg(long)]
    pub check_values: bool,
    /// Seed of the key draws [default: from the clock].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Processes sharing this load (each with --conns connections): the
    /// connections of all are numbered apart (key draws, writers of
    /// --check-values).
    #[arg(long, default_value_t = 1)]
    pub procs: usize,
    /// This process's place among --procs, from 0.
    #[arg(long, default_value_t = 0)]
    pub proc_index: usize,
    /// Send the first operation at this time (ms since the Unix epoch),
    /// once connected: processes of one load start together.
    #[arg(long, value_name = "UNIX_MS")]
    pub start_at: Option<u64>,
    /// Also write the figures, every latency bucket included, to FILE, for
    /// `workload --merge`.
    #[arg(long, value_name = "FILE")]
    pub hist_out: Option<PathBuf>,
}

impl Options {
    /// Checks the flags that must be positive or within a range.
    ///
    /// # Errors
    /// Names the flag that is out of range.
    pub fn validate(&self) -> Result<()> {
        if self.conns == 0 || self.pipeline == 0 || self.keys == 0 || self.populate_batch == 0 {
            bail!("--conns, --pipeline, --keys and --populate-batch must be positive");
        }
        if !(0.0..=100.0).contains(&self.write_pct) {
            bail!("--write-pct must be within 0..=100");
        }
        if self.procs == 0 || self.proc_index >= self.procs {
            bail!("--procs must be positive and --proc-index below it");
        }
        if self.check_values && self.keys < self.all_conns() {
            bail!("--check-values needs at least --conns × --procs keys");
        }
        Ok(())
    }

    /// Connections of the load in all its processes.
    fn all_conns(&self) -> u64 {
        (self.conns * self.procs) as u64
    }
}

/// One operation sent, to match its reply.
#[derive(Clone, Copy)]
struct Op {
    key: u64,
    /// The version written (writes only).
    write: Option<u64>,
}

/// One connection's operation source.
struct Gen {
    cfg: Arc<Cfg>,
    rng: Rng,
    /// This connection's number among every process's.
    conn: u64,
    /// Versions written start above this (the start time in µs, so a later
    /// run's versions are above an earlier run's).
    base: u64,
    written: u64,
    /// Check mode: the newest version seen or written per key.
    seen: HashMap<u64, u64>,
}

impl Gen {
    fn push(&mut self, out: &mut Vec<u8>, ops: &mut Vec<Op>) {
        let cfg = &self.cfg;
        let mut key = cfg.sampler.sample(&mut self.rng);
        if self.rng.unit() < cfg.write_frac {
            if cfg.check {
                // The key of the same popularity group this connection owns.
                key = key - key % cfg.conns + self.conn;
                if key >= cfg.keys {
                    key -= cfg.conns;
                }
            }
            self.written += 1;
            let version = self.base + self.written;
            cfg.push_write(out, key, self.conn, version);
            ops.push(Op {
                key,
                write: Some(version),
            });
        } else {
            cfg.push_read(out, key);
            ops.push(Op { key, write: None });
        }
    }

    fn reply(&mut self, op: Op, frame: BytesMut, t: &mut Tally) {
        match op.write {
            Some(_) => t.writes += 1,
            None => t.reads += 1,
        }
        match frame.first() {
            Some(b'-') => {
                if t.errors == 0 {
                    eprintln!(
                        "workload: error reply: {}",
                        String::from_utf8_lossy(&frame).trim_end()
                    );
                }
                t.errors += 1;
                return;
            }
            _ if op.write.is_none()
                && (frame.starts_with(b"$-1\r\n")
                    || frame.starts_with(b"_\r\n")
                    || frame.starts_with(b"*0\r\n")
                    || frame.starts_with(b"%0\r\n")) =>
            {
                t.nils += 1;
                return;
            }
            _ => {}
        }
        if !self.cfg.check {
            return;
        }
        let got = match op.write {
            Some(v) => v,
            None => match self.cfg.version_of(frame) {
                Some(v) => v,
                None => return,
            },
        };
        let seen = self.seen.entry(op.key).or_insert(0);
        if got < *seen {
            t.backwards += 1;
        } else {
            *seen = got;
        }
    }
}

/// How much work is left: `--ops` handed out a pipeline at a time, or a
/// deadline.
struct Budget {
    total: u64,
    issued: AtomicU64,
    deadline: Option<Instant>,
}

impl Budget {
    /// Operations for the next round trip (at most `p`); 0 when done.
    fn claim(&self, p: usize) -> usize {
        if let Some(d) = self.deadline {
            return if Instant::now() >= d { 0 } else { p };
        }
        let old = self.issued.fetch_add(p as u64, Ordering::Relaxed);
        self.total.saturating_sub(old).min(p as u64) as usize
    }
}

/// One connection of the load, until the budget is spent.
async fn drive(
    mut s: Box<dyn Io>,
    mut g: Gen,
    pipeline: usize,
    budget: Arc<Budget>,
) -> Result<Tally> {
    let mut t = Tally::new();
    let mut out = Vec::with_capacity(4096);
    let mut ops = Vec::with_capacity(pipeline);
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut sc = Scanner::new();
    loop {
        let n = budget.claim(pipeline);
        if n == 0 {
            return Ok(t);
        }
        out.clear();
        ops.clear();
        for _ in 0..n {
            g.push(&mut out, &mut ops);
        }
        let sent = Instant::now();
        s.write_all(&out).await?;
        let reads = t.reads;
        for &op in &ops {
            let f = read_frame(&mut s, &mut buf, &mut sc).await?;
            g.reply(op, f, &mut t);
        }
        let took = sent.elapsed();
        t.hist.record(took);
        if t.reads == reads {
            t.write_hist.record(took);
        }
    }
}

/// Populates if asked, then runs the load and prints its line (and writes
/// `--hist-out`). Call [`Options::validate`] first.
///
/// # Errors
/// A connection failing, a failed populate write, or `--hist-out` not
/// written. Error replies during the load are counted, not errors.
pub async fn run(common: &Common, o: &Options) -> Result<()> {
    let value_size = match o.kind {
        Kind::String => common.value_size,
        Kind::Hash => (common.value_size / HASH_FIELDS).max(1),
    };
    let prefix = common.prefix.clone().unwrap_or_else(|| {
        match o.kind {
            Kind::String => "wl:",
            Kind::Hash => "wlh:",
        }
        .to_owned()
    });
    let cfg = Arc::new(Cfg {
        keys: o.keys,
        sampler: Sampler::new(o.dist, o.keys, o.zipf_s),
        write_frac: o.write_pct / 100.0,
        kind: o.kind,
        prefix,
        value_size,
        check: o.check_values,
        conns: o.all_conns(),
    });
    let unix = common.unix.as_deref();
    if o.populate {
        populate::all(&cfg, &common.target, unix, o.conns, o.populate_batch).await?;
        if o.ops == 0 && o.secs.is_none() {
            return Ok(());
        }
    }
    let seed = o.seed.unwrap_or_else(now_seed);
    let base = now_us();
    let mut conns = Vec::new();
    for _ in 0..o.conns {
        conns.push(connect(&common.target, unix).await?);
    }
    if let Some(ms) = o.start_at {
        match (UNIX_EPOCH + Duration::from_millis(ms)).duration_since(SystemTime::now()) {
            Ok(wait) => tokio::time::sleep(wait).await,
            Err(late) => eprintln!(
                "workload: ready {:.1} ms after --start-at",
                late.duration().as_secs_f64() * 1e3
            ),
        }
    }
    let started = Instant::now();
    let start_unix_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let budget = Arc::new(Budget {
        total: o.ops,
        issued: AtomicU64::new(0),
        deadline: o.secs.map(|s| started + Duration::from_secs_f64(s)),
    });
    let first = (o.proc_index * o.conns) as u64;
    let mut tasks = Vec::new();
    for (c, s) in conns.into_iter().enumerate() {
        let conn = first + c as u64;
        let g = Gen {
            cfg: Arc::clone(&cfg),
            rng: Rng(seed ^ (conn + 1).wrapping_mul(0xD1B5_4A32_D192_ED03)),
            conn,
            base,
            written: 0,
            seen: HashMap::new(),
        };
        tasks.push(tokio::spawn(drive(s, g, o.pipeline, Arc::clone(&budget))));
    }
    let mut tally = Tally::new();
    for t in tasks {
        tally.merge(&t.await??);
    }
    let report = Report {
        tally,
        start_unix_ns,
        secs: started.elapsed().as_secs_f64(),
    };
    println!("{}", report.line());
    if let Some(path) = &o.hist_out {
        std::fs::write(path, report.to_text())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// A seed from the clock, so two runs do not draw the same keys.
fn now_seed() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}
