//! State shared by all connections: the upstream, the command table, limits,
//! counters and the client registry (for CLIENT LIST).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use bytes::Bytes;
use sidecache_l1::L1;
use sidecache_pool::Upstream;

use crate::flight::Flights;
use crate::metrics::Metrics;

use crate::cmd::table::CommandTable;
use crate::config::Config;

/// Counters, updated without locks (relaxed atomics, once per batch).
#[derive(Debug, Default)]
pub struct Stats {
    /// Connections accepted.
    pub connections_received: AtomicU64,
    /// Connections refused by `--maxclients`.
    pub rejected_connections: AtomicU64,
    /// Commands processed.
    pub commands: AtomicU64,
    /// Commands answered with an upstream error.
    pub upstream_errors: AtomicU64,
    /// Requests that could not be parsed (the client is disconnected).
    pub protocol_errors: AtomicU64,
}

/// The invalidation channel (client tracking) as metrics and INFO see it.
///
/// TODO(#5): fed by the coherence work in `sidecache-pool`: the tracking
/// listener calls [`Tracking::set_up`] when a master's tracking connection
/// comes up or is lost, and [`Tracking::received`] for each invalidation
/// message. Until it does, no master is listed and INFO says `tracking:off`.
#[derive(Debug, Default)]
pub struct Tracking {
    invalidations_received: AtomicU64,
    shards: Mutex<BTreeMap<String, bool>>,
}

impl Tracking {
    /// The tracking connection to the master at `shard` is up or down.
    pub fn set_up(&self, shard: &str, up: bool) {
        let mut g = self.shards.lock().unwrap_or_else(|p| p.into_inner());
        g.insert(shard.to_owned(), up);
    }

    /// `n` invalidation messages arrived.
    pub fn received(&self, n: u64) {
        self.invalidations_received.fetch_add(n, Ordering::Relaxed);
    }

    /// Invalidation messages received since start.
    pub fn invalidations_received(&self) -> u64 {
        self.invalidations_received.load(Ordering::Relaxed)
    }

    /// Each master's tracking state, by address.
    pub fn shards(&self) -> Vec<(String, bool)> {
        let g = self.shards.lock().unwrap_or_else(|p| p.into_inner());
        g.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }

    /// `off` (no channel), `up` (every master), `down` (none) or `partial`.
    pub fn state(&self) -> &'static str {
        let shards = self.shards();
        let up = shards.iter().filter(|s| s.1).count();
        match (shards.len(), up) {
            (0, _) => "off",
            (n, u) if n == u => "up",
            (_, 0) => "down",
            _ => "partial",
        }
    }
}

/// What CLIENT LIST shows of a client; updated only on rare events.
#[derive(Debug, Clone)]
pub struct ClientEntry {
    /// Peer address.
    pub addr: String,
    /// Local address.
    pub laddr: String,
    /// Name set by CLIENT SETNAME / HELLO SETNAME.
    pub name: String,
    /// Selected database.
    pub db: u16,
    /// Protocol version.
    pub resp: u8,
    /// Connect time.
    pub created: Instant,
    /// CLIENT SETINFO lib-name.
    pub lib_name: String,
    /// CLIENT SETINFO lib-ver.
    pub lib_ver: String,
}

impl ClientEntry {
    /// The CLIENT INFO / CLIENT LIST line of this client, as Redis formats it.
    pub fn line(&self, id: u64) -> String {
        format!(
            "id={id} addr={} laddr={} fd=-1 name={} age={} idle=0 flags=N db={} sub=0 psub=0 ssub=0 multi=-1 qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem=0 tot-mem=0 events=r cmd=client user=default redir=-1 resp={} lib-name={} lib-ver={}\n",
            self.addr,
            self.laddr,
            self.name,
            self.created.elapsed().as_secs(),
            self.db,
            self.resp,
            self.lib_name,
            self.lib_ver
        )
    }
}

/// Everything connections share.
#[derive(Debug)]
pub struct Shared {
    /// The upstream router.
    pub upstream: Upstream,
    /// The command table.
    pub table: CommandTable,
    /// Validated configuration.
    pub config: Config,
    /// Counters.
    pub stats: Stats,
    /// When the proxy started.
    pub started: Instant,
    /// The L1 cache.
    pub l1: L1,
    /// L1 misses being fetched (coalescing).
    pub flights: Flights,
    /// Per-command metrics and what only the proxy counts.
    pub metrics: Metrics,
    /// The invalidation channel's state.
    pub tracking: Tracking,
    next_id: AtomicU64,
    clients: Mutex<BTreeMap<u64, ClientEntry>>,
}

impl Shared {
    /// Shared state for a running proxy.
    pub fn new(upstream: Upstream, table: CommandTable, config: Config) -> Shared {
        Shared {
            l1: L1::new(config.l1.clone()),
            flights: Flights::default(),
            metrics: Metrics::new(&table, config.metrics_listen.is_some()),
            tracking: Tracking::default(),
            upstream,
            table,
            config,
            stats: Stats::default(),
            started: Instant::now(),
            next_id: AtomicU64::new(1),
            clients: Mutex::new(BTreeMap::new()),
        }
    }

    /// Drops a key from the L1 and forgets its flight: a write touched it.
    pub fn invalidate(&self, db: u16, key: &Bytes) {
        self.l1.invalidate(db, key);
        self.flights.forget(db, key);
    }

    /// Drops everything cached (FLUSHALL, keys that cannot be known).
    pub fn invalidate_all(&self) {
        self.l1.clear();
        self.flights.forget_all();
    }

    /// A fresh client id.
    pub fn next_client_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Runs `f` on the client registry.
    pub fn with_clients<R>(&self, f: impl FnOnce(&mut BTreeMap<u64, ClientEntry>) -> R) -> R {
        let mut g = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }

    /// Connected clients.
    pub fn connected_clients(&self) -> usize {
        self.with_clients(|c| c.len())
    }
}

/// Drops from the L1 the keys of a write-behind write that failed for good,
/// so the proxy stops serving a value upstream never got.
#[derive(Debug)]
pub struct InvalidateOnFailure(pub std::sync::Weak<Shared>);

impl sidecache_pool::WriteListener for InvalidateOnFailure {
    fn failed(&self, db: u16, keys: &[Bytes], _error: &str) {
        if let Some(shared) = self.0.upgrade() {
            for k in keys {
                shared.invalidate(db, k);
            }
        }
    }
}
