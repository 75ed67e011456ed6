//! Metrics kept by the proxy itself, and how they stay off the hot path.
//!
//! Most figures already exist as relaxed atomic counters owned by the part
//! that updates them ([`stats::Stats`], the L1's stats, the pool's
//! write-behind stats); the report layer above (`report/export.rs`) reads
//! them at scrape time and nothing counts them twice. What only a client
//! connection knows — commands by name and outcome, and the latency clients
//! see — is counted here:
//!
//! - **handles resolved once**: a command's counters are an index
//!   ([`crate::cmd::table::CommandInfo::id`]) into a fixed array of atomics
//!   built at start; no registry lookup, no label hashing, no lock per
//!   command;
//! - **one shared update per batch**: a connection tallies its batch in
//!   plain integers ([`ConnMetrics`]) and adds them to the shared atomics
//!   after the batch's replies are written: one clock read per batch, one
//!   atomic add per distinct command and per latency path per batch.
//!
//! `--metrics-listen off` also turns this tallying off (the scrape-time
//! figures cost nothing until scraped).
//!
//! Every exported metric is listed once, with its help text, in
//! `report/export.rs`'s `FAMILIES`.

pub mod hotkeys;
pub mod prefix;
pub mod stats;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use sidecache_pool::cluster::topology::Topology;

use crate::cmd::local::Local;
use crate::cmd::table::CommandTable;
use prefix::{PrefixStats, PrefixTally};

/// Upper bounds of the client-latency histogram buckets, nanoseconds
/// (10 µs … 2.5 s; L1 hits land in the first few, upstream round trips in
/// the middle).
pub const LATENCY_BOUNDS_NS: [u64; 17] = [
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
];

/// The command id that is not counted (a protocol error's reply).
const NONE: u16 = u16::MAX;

/// How a command was answered, for the latency split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// From the L1 (GET hit, MGET with every key a hit).
    L1Hit = 0,
    /// Upstream took part (misses, forwarded commands, fan-outs).
    Upstream = 1,
    /// Answered by the proxy alone (PING, CLIENT …, write-behind
    /// acknowledgements, local errors).
    Local = 2,
}

impl Path {
    /// Every path, in index order.
    pub const ALL: [Path; 3] = [Path::L1Hit, Path::Upstream, Path::Local];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Path::L1Hit => "l1_hit",
            Path::Upstream => "upstream",
            Path::Local => "local",
        }
    }
}

/// A histogram fed without locks: fixed buckets of relaxed atomics.
#[derive(Debug)]
pub struct AtomicHistogram {
    /// Non-cumulative counts; the last is above every bound.
    buckets: [AtomicU64; LATENCY_BOUNDS_NS.len() + 1],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Default for AtomicHistogram {
    fn default() -> Self {
        AtomicHistogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
        }
    }
}

/// A histogram's figures at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Cumulative counts per bound of [`LATENCY_BOUNDS_NS`].
    pub cumulative: Vec<u64>,
    /// Observations.
    pub count: u64,
    /// Sum of observations, nanoseconds.
    pub sum_ns: u64,
}

impl AtomicHistogram {
    /// Records `n` observations of `ns` nanoseconds.
    pub fn observe_n(&self, ns: u64, n: u64) {
        let i = LATENCY_BOUNDS_NS.partition_point(|&b| b < ns);
        self.buckets[i].fetch_add(n, Ordering::Relaxed);
        self.count.fetch_add(n, Ordering::Relaxed);
        self.sum_ns
            .fetch_add(ns.saturating_mul(n), Ordering::Relaxed);
    }

    /// The figures now (buckets read one by one: a scrape racing an update
    /// may see `count` one batch ahead of the buckets, as with any lock-free
    /// histogram).
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut acc = 0;
        let cumulative = self.buckets[..LATENCY_BOUNDS_NS.len()]
            .iter()
            .map(|b| {
                acc += b.load(Ordering::Relaxed);
                acc
            })
            .collect();
        HistogramSnapshot {
            cumulative,
            count: self.count.load(Ordering::Relaxed),
            sum_ns: self.sum_ns.load(Ordering::Relaxed),
        }
    }
}

/// Counters of one upstream master, as client connections see it.
#[derive(Debug, Default)]
pub struct ShardCounters {
    /// Commands sent to it by client connections.
    pub commands: AtomicU64,
    /// Client pipelines to it that failed (connect, connection lost,
    /// write-behind wait timed out).
    pub pipeline_failures: AtomicU64,
    /// Client pipelines that first waited for its queued writes.
    pub write_waits: AtomicU64,
}

/// The proxy's own metrics, shared by all connections.
#[derive(Debug)]
pub struct Metrics {
    enabled: bool,
    /// Command names by id; the last is `unknown`.
    names: Vec<String>,
    /// `id * 2 + outcome` (0 ok, 1 error).
    commands: Box<[AtomicU64]>,
    latency: [AtomicHistogram; 3],
    get_id: u16,
    local_ids: [u16; LOCALS.len()],
    shards: Mutex<BTreeMap<String, Arc<ShardCounters>>>,
    /// MOVED and ASK replies seen by client connections.
    pub redirects: [AtomicU64; 2],
    /// Master-set changes seen after start.
    pub topology_changes: AtomicU64,
    /// Writes flushed during the shutdown drain.
    pub shutdown_flushed: AtomicU64,
    /// Writes left unflushed when the shutdown drain gave up.
    pub shutdown_unflushed: AtomicU64,
    /// Set when shutdown began: readiness fails from then on.
    pub shutting_down: AtomicBool,
    /// `--prefix-stats`: L1 figures per key prefix (off when metrics are).
    pub prefixes: PrefixStats,
}

/// Local commands and the name they are counted under.
const LOCALS: [(Local, &str); 10] = [
    (Local::Ping, "ping"),
    (Local::Echo, "echo"),
    (Local::Quit, "quit"),
    (Local::Select, "select"),
    (Local::Hello, "hello"),
    (Local::Auth, "auth"),
    (Local::Client, "client"),
    (Local::Reset, "reset"),
    (Local::ClusterDisabled, "cluster"),
    (Local::Sidecache, "sidecache"),
];

fn local_index(l: Local) -> usize {
    match l {
        Local::Ping => 0,
        Local::Echo => 1,
        Local::Quit => 2,
        Local::Select => 3,
        Local::Hello => 4,
        Local::Auth => 5,
        Local::Client => 6,
        Local::Reset => 7,
        Local::ClusterDisabled => 8,
        Local::Sidecache => 9,
    }
}

impl Metrics {
    /// Metrics for the commands of `table`; `enabled: false` makes every
    /// hot-path call a no-op.
    pub fn new(table: &CommandTable, enabled: bool) -> Metrics {
        let mut names: Vec<String> = table.names().to_vec();
        let id_of = |name: &str| {
            table
                .lookup(&[bytes::Bytes::copy_from_slice(name.as_bytes())])
                .map(|i| i.id)
        };
        // A local command upstream does not know (SIDECACHE; CLUSTER on a
        // standalone server that lacks it) is counted under its own name,
        // after the table's; `unknown` stays last.
        let local_ids = LOCALS.map(|(_, n)| {
            id_of(n).unwrap_or_else(|| {
                names.push(n.into());
                (names.len() - 1) as u16
            })
        });
        let unknown = names.len() as u16;
        names.push("unknown".into());
        Metrics {
            enabled,
            commands: (0..names.len() * 2).map(|_| AtomicU64::new(0)).collect(),
            latency: Default::default(),
            get_id: id_of("get").unwrap_or(unknown),
            local_ids,
            names,
            shards: Mutex::new(BTreeMap::new()),
            redirects: Default::default(),
            topology_changes: AtomicU64::new(0),
            shutdown_flushed: AtomicU64::new(0),
            shutdown_unflushed: AtomicU64::new(0),
            shutting_down: AtomicBool::new(false),
            prefixes: PrefixStats::default(),
        }
    }

    /// Also counts L1 lookups by these key prefixes, or by first segments
    /// up to `separator` (while metrics are on).
    pub fn with_prefixes(mut self, prefixes: &[Vec<u8>], separator: Option<u8>) -> Metrics {
        if self.enabled {
            self.prefixes = match separator {
                Some(sep) => PrefixStats::by_separator(sep, crate::config::MAX_PREFIX_STATS),
                None => PrefixStats::new(prefixes),
            };
        }
        self
    }

    /// Whether per-command metrics are kept.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The id of commands the upstream table does not know.
    pub fn unknown_id(&self) -> u16 {
        (self.names.len() - 1) as u16
    }

    /// The id a local command is counted under.
    pub fn local_id(&self, l: Local) -> u16 {
        self.local_ids[local_index(l)]
    }

    /// The id of GET.
    pub fn get_id(&self) -> u16 {
        self.get_id
    }

    /// Counts a redirect in an upstream reply frame (MOVED or ASK).
    pub fn note_redirect(&self, frame: &[u8]) {
        let i = if frame.starts_with(b"-MOVED ") {
            0
        } else if frame.starts_with(b"-ASK ") {
            1
        } else {
            return;
        };
        self.redirects[i].fetch_add(1, Ordering::Relaxed);
    }

    /// The counters of the master at `addr` (created on first use).
    pub fn shard(&self, addr: &str) -> Arc<ShardCounters> {
        let mut m = self.shards.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(m.entry(addr.to_owned()).or_default())
    }

    /// Every master's counters, by address.
    pub fn shards(&self) -> Vec<(String, Arc<ShardCounters>)> {
        let m = self.shards.lock().unwrap_or_else(|p| p.into_inner());
        m.iter().map(|(k, v)| (k.clone(), Arc::clone(v))).collect()
    }

    /// Non-zero command counters: (name, error?, count).
    pub fn commands(&self) -> Vec<(&str, bool, u64)> {
        let mut out = Vec::new();
        for (id, name) in self.names.iter().enumerate() {
            for outcome in 0..2 {
                let n = self.commands[id * 2 + outcome].load(Ordering::Relaxed);
                if n > 0 {
                    out.push((name.as_str(), outcome == 1, n));
                }
            }
        }
        out
    }

    /// The latency histogram of one path.
    pub fn latency(&self, path: Path) -> &AtomicHistogram {
        &self.latency[path as usize]
    }
}

#[derive(Debug, Clone, Copy)]
struct Tally {
    id: u16,
    ok: u32,
    err: u32,
}

/// One connection's tally of the batch in hand, added to [`Metrics`] once
/// the batch's replies are written.
///
/// Commands are recorded in dispatch order ([`ConnMetrics::command`]) and
/// their replies in the same order ([`ConnMetrics::replied`]): every
/// dispatched command yields exactly one reply entry, so the two line up
/// even when a session change resolves part of a batch early.
#[derive(Debug)]
pub struct ConnMetrics {
    on: bool,
    read_at: Instant,
    ids: Vec<u16>,
    cursor: usize,
    tally: Vec<Tally>,
    paths: [u64; 3],
    topo: Option<Arc<Topology>>,
    shards: Vec<Arc<ShardCounters>>,
    /// `--prefix-stats`: this batch's L1 lookups by prefix.
    pub prefix: PrefixTally,
}

impl ConnMetrics {
    /// A fresh tally (a no-op one when metrics are off).
    pub fn new(m: &Metrics) -> ConnMetrics {
        ConnMetrics {
            on: m.enabled,
            read_at: Instant::now(),
            ids: Vec::new(),
            cursor: 0,
            tally: Vec::new(),
            paths: [0; 3],
            topo: None,
            shards: Vec::new(),
            prefix: PrefixTally::new(&m.prefixes),
        }
    }

    /// Requests were just read: client-seen latency counts from here. The
    /// time it read, when it read one (metrics on).
    #[inline]
    pub fn read(&mut self) -> Option<Instant> {
        if self.on {
            self.read_at = Instant::now();
            Some(self.read_at)
        } else {
            None
        }
    }

    /// A command with this id was dispatched.
    #[inline]
    pub fn command(&mut self, id: u16) {
        if self.on {
            self.ids.push(id);
        }
    }

    /// A reply that answers no command (a protocol error) was queued.
    pub fn uncounted(&mut self) {
        self.command(NONE);
    }

    /// The next command's reply was written to the output: `reply` is its
    /// bytes (an error starts with `-`, or `!` in RESP3).
    #[inline]
    pub fn replied(&mut self, path: Path, reply: &[u8]) {
        if !self.on {
            return;
        }
        let Some(&id) = self.ids.get(self.cursor) else {
            return;
        };
        self.cursor += 1;
        if id == NONE {
            return;
        }
        self.paths[path as usize] += 1;
        let err = matches!(reply.first(), Some(b'-' | b'!'));
        let t = match self.tally.iter_mut().rev().find(|t| t.id == id) {
            Some(t) => t,
            None => {
                self.tally.push(Tally { id, ok: 0, err: 0 });
                let last = self.tally.len() - 1;
                &mut self.tally[last]
            }
        };
        if err {
            t.err += 1;
        } else {
            t.ok += 1;
        }
    }

    /// The replies resolved so far were all written to the output buffer.
    #[inline]
    pub fn resolved(&mut self) {
        if self.cursor > 0 {
            self.ids.drain(..self.cursor);
            self.cursor = 0;
        }
    }

    /// The output buffer reached the client: adds the batch to `m`.
    pub fn written(&mut self, m: &Metrics) {
        if self.prefix.on() {
            self.prefix.flush(&m.prefixes);
        }
        if !self.on || self.paths == [0; 3] {
            return;
        }
        let ns = u64::try_from(self.read_at.elapsed().as_nanos()).unwrap_or(u64::MAX);
        for p in Path::ALL {
            let n = std::mem::take(&mut self.paths[p as usize]);
            if n > 0 {
                m.latency[p as usize].observe_n(ns, n);
            }
        }
        for t in self.tally.drain(..) {
            let i = usize::from(t.id) * 2;
            if let Some(c) = m.commands.get(i..i + 2) {
                if t.ok > 0 {
                    c[0].fetch_add(u64::from(t.ok), Ordering::Relaxed);
                }
                if t.err > 0 {
                    c[1].fetch_add(u64::from(t.err), Ordering::Relaxed);
                }
            }
        }
    }

    /// The counters of node `node` of `topo` (handles re-resolved only when
    /// the topology changed).
    pub fn shard(
        &mut self,
        m: &Metrics,
        topo: &Arc<Topology>,
        node: usize,
    ) -> Option<&ShardCounters> {
        if !self.on {
            return None;
        }
        if !self.topo.as_ref().is_some_and(|t| Arc::ptr_eq(t, topo)) {
            self.shards = topo
                .nodes()
                .iter()
                .map(|n| m.shard(&n.addr().to_string()))
                .collect();
            self.topo = Some(Arc::clone(topo));
        }
        self.shards.get(node).map(|s| &**s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = AtomicHistogram::default();
        h.observe_n(5_000, 3); // ≤ 10 µs
        h.observe_n(10_000, 1); // exactly on a bound: that bucket
        h.observe_n(30_000, 2); // ≤ 50 µs
        h.observe_n(10_000_000_000, 1); // above every bound
        let s = h.snapshot();
        assert_eq!(s.count, 7);
        assert_eq!(s.cumulative[0], 4);
        assert_eq!(s.cumulative[1], 4);
        assert_eq!(s.cumulative[2], 6);
        assert_eq!(*s.cumulative.last().expect("buckets"), 6);
        assert_eq!(s.sum_ns, 5_000 * 3 + 10_000 + 60_000 + 10_000_000_000);
    }

    fn metrics() -> Metrics {
        use sidecache_resp::frame::Value;
        let entry = |name: &str| {
            Value::Array(vec![
                Value::Bulk(bytes::Bytes::copy_from_slice(name.as_bytes())),
                Value::Int(-1),
                Value::Array(vec![]),
                Value::Int(1),
                Value::Int(1),
                Value::Int(1),
            ])
        };
        let table =
            CommandTable::from_command_reply(Value::Array(vec![entry("get"), entry("set")]))
                .expect("table");
        Metrics::new(&table, true)
    }

    #[test]
    fn replies_line_up_with_commands_across_early_resolution() {
        let m = metrics();
        let mut c = ConnMetrics::new(&m);
        let get = m.get_id();
        c.command(get);
        c.command(m.unknown_id());
        // A session change resolves the first two before the third is queued.
        c.replied(Path::L1Hit, b"$1\r\nv\r\n");
        c.replied(Path::Upstream, b"-ERR unknown command\r\n");
        c.command(get);
        c.resolved();
        c.uncounted();
        c.replied(Path::Upstream, b"$-1\r\n");
        c.replied(Path::Local, b"-ERR Protocol error\r\n");
        c.resolved();
        c.written(&m);
        let cmds = m.commands();
        assert_eq!(cmds, vec![("get", false, 2), ("unknown", true, 1)]);
        assert_eq!(m.latency(Path::L1Hit).snapshot().count, 1);
        assert_eq!(m.latency(Path::Upstream).snapshot().count, 2);
        assert_eq!(m.latency(Path::Local).snapshot().count, 0);
    }

    #[test]
    fn local_commands_upstream_lacks_count_under_their_name() {
        let m = metrics();
        // The table has get and set only: PING and SIDECACHE get ids of
        // their own, after the table's, and unknown stays last.
        let (ping, sidecache) = (m.local_id(Local::Ping), m.local_id(Local::Sidecache));
        assert!(ping > m.get_id() && ping != sidecache);
        assert!(sidecache < m.unknown_id());
        let mut c = ConnMetrics::new(&m);
        for id in [sidecache, sidecache, ping, m.unknown_id()] {
            c.command(id);
            c.replied(Path::Local, b"+OK\r\n");
        }
        c.resolved();
        c.written(&m);
        assert_eq!(
            m.commands(),
            vec![
                ("ping", false, 1),
                ("sidecache", false, 2),
                ("unknown", false, 1)
            ]
        );
        assert_eq!(m.latency(Path::Local).snapshot().count, 4);
    }

    #[test]
    fn off_records_nothing() {
        let mut m = metrics();
        m.enabled = false;
        let mut c = ConnMetrics::new(&m);
        c.command(m.get_id());
        c.replied(Path::L1Hit, b"+OK\r\n");
        c.resolved();
        c.written(&m);
        assert!(m.commands().is_empty());
    }

    #[test]
    fn redirects() {
        let m = metrics();
        m.note_redirect(b"-MOVED 1 127.0.0.1:1\r\n");
        m.note_redirect(b"-ASK 1 127.0.0.1:1\r\n");
        m.note_redirect(b"-ERR x\r\n");
        assert_eq!(m.redirects[0].load(Ordering::Relaxed), 1);
        assert_eq!(m.redirects[1].load(Ordering::Relaxed), 1);
    }
}
