//! State shared by all connections: the upstream, the command table, limits,
//! counters, the L1 and its fetches in flight, the client registry (for
//! CLIENT LIST and KILL), ACL users' pools, CLIENT PAUSE and what lost
//! invalidation channels leave served. Everything above this layer
//! (local commands, reports, connections, listeners) reads it; nothing here
//! reaches up to them.

pub mod clients;
pub mod flight;
pub mod kill;
pub mod pause;
pub mod stale;
pub mod turns;
pub mod users;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use bytes::Bytes;
use sidecache_l1::L1;
use sidecache_pool::Upstream;

use crate::cmd::table::CommandTable;
use crate::config::Config;
use crate::metrics::stats::Stats;
use crate::metrics::Metrics;
use crate::state::clients::ClientEntry;
use crate::state::flight::Flights;

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
    /// The hottest keys by reads, misses and writes (`--hotkeys-*`).
    pub hotkeys: crate::metrics::hotkeys::HotKeys,
    /// Shared upstream subscriptions and the MONITOR feed.
    pub pubsub: std::sync::Arc<crate::pubsub::Hub>,
    /// CLIENT TRACKING: which client follows which key.
    pub tracked: crate::tracking::Tracked,
    /// The connection pools of ACL users clients authenticated as.
    pub users: crate::state::users::Users,
    /// `--l1-stale-if-error`: what lost channels left served.
    pub stale: crate::state::stale::Stale,
    /// CLIENT PAUSE.
    pub pause: crate::state::pause::Pause,
    /// `CLIENT SIDECACHE-TEST-PANIC` panics (SIDECACHE_TEST_PANIC=1 at
    /// start; for the panic-isolation test only).
    pub test_panic: bool,
    /// The invalidation channel's state.
    next_id: AtomicU64,
    clients: Mutex<BTreeMap<u64, ClientEntry>>,
    /// Clients blocked now: their node and the upstream id of the held
    /// connection their command blocks on (for CLIENT UNBLOCK).
    pub blocked: Mutex<std::collections::HashMap<u64, (std::sync::Arc<sidecache_pool::Node>, i64)>>,
    /// Each node's turn for blocking commands (served in the order they
    /// blocked).
    pub turns: crate::state::turns::Turns,
}

impl Shared {
    /// Shared state for a running proxy.
    pub fn new(upstream: Upstream, table: CommandTable, config: Config) -> Shared {
        let mut l1 = config.l1.clone();
        if !config.l1_ttl_cap_given
            && upstream.coherence_mode()
                != sidecache_pool::coherence::tracking::CoherenceMode::Tracking
        {
            // Nothing reports other writers' changes: the cap is their bound.
            l1.ttl_cap = l1.ttl_cap.min(sidecache_l1::config::UNTRACKED_TTL_CAP);
            tracing::info!(
                ttl_cap_secs = l1.ttl_cap.as_secs_f64(),
                "no client tracking upstream: --l1-ttl-cap defaults to the shorter cap"
            );
        }
        Shared {
            l1: L1::new(l1),
            flights: Flights::default(),
            tracked: crate::tracking::Tracked::new(config.tracking_table_max_keys),
            stale: crate::state::stale::Stale::new(config.l1_stale_if_error),
            pause: crate::state::pause::Pause::new(config.script_flags_max),
            users: crate::state::users::Users::new(
                config.acl_max_users,
                config.acl_user_connections,
            ),
            test_panic: std::env::var_os("SIDECACHE_TEST_PANIC").is_some_and(|v| v == "1"),
            pubsub: std::sync::Arc::new(crate::pubsub::Hub::new(
                config.output_limit_pubsub,
                upstream.write_behind().config().queue_timeout,
            )),
            metrics: Metrics::new(&table, config.metrics_listen.is_some())
                .with_prefixes(&config.prefix_stats, config.prefix_separator),
            hotkeys: crate::metrics::hotkeys::HotKeys::new(
                config.hotkeys_capacity,
                config.hotkeys_sample,
            ),
            upstream,
            table,
            config,
            stats: Stats::default(),
            started: Instant::now(),
            next_id: AtomicU64::new(1),
            clients: Mutex::new(BTreeMap::new()),
            blocked: Mutex::default(),
            turns: crate::state::turns::Turns::default(),
        }
    }

    /// Drops a key from the L1 and forgets its flight: a write touched it.
    /// Tracking clients that read it are told.
    pub fn invalidate(&self, db: u16, key: &Bytes) {
        self.invalidate_from(db, key, None);
    }

    /// [`Shared::invalidate`] for a write of client `origin` (whose NOLOOP
    /// tracking is not told of it).
    pub fn invalidate_from(&self, db: u16, key: &Bytes, origin: Option<u64>) {
        self.l1.invalidate(db, key);
        self.flights.forget(db, key);
        if self.tracked.active() {
            self.tracked.invalidate(std::slice::from_ref(key), origin);
        }
    }

    /// Drops `keys` from the L1 in every database and forgets their
    /// flights, telling no tracking client (invalidation channels name
    /// keys, not databases).
    fn forget_everywhere(&self, keys: &[Bytes]) {
        self.forget_everywhere_but(keys, None);
    }

    /// [`Shared::forget_everywhere`], sparing database `spare`.
    fn forget_everywhere_but(&self, keys: &[Bytes], spare: Option<u16>) {
        for k in keys {
            self.l1.for_used_dbs(|db| {
                if Some(db) != spare {
                    self.l1.invalidate(db, k);
                    self.flights.forget(db, k);
                }
            });
        }
    }

    /// Drops a key from the L1 and forgets its flight, telling no tracking
    /// client: the write is not made yet (its acknowledgement tells them).
    pub fn drop_cached(&self, db: u16, key: &Bytes) {
        self.l1.invalidate(db, key);
        self.flights.forget(db, key);
    }

    /// What a channel of `node` covers: every key (standalone), its
    /// slots (a master, or a replica's master under replica reads), or
    /// nothing it still serves (a master that left the map: dropped when
    /// the topology changed).
    fn covered(&self, node: &sidecache_pool::NodeAddr) -> Covered {
        let topo = self.upstream.topology();
        if !topo.is_cluster() {
            return Covered::All;
        }
        // A replica's channel (replica reads) covers its master's slots.
        let Some(idx) = topo.index_of(node).or_else(|| topo.master_of_replica(node)) else {
            // A replica that left the map may have filled values that no
            // install dropped: everything.
            return if self.upstream.replica_reads().is_some() {
                Covered::All
            } else {
                Covered::Nothing
            };
        };
        Covered::Slots(
            (0..sidecache_pool::cluster::slot::SLOT_COUNT)
                .map(|s| {
                    sidecache_pool::Slot::new(s)
                        .and_then(|s| topo.node_index(s).ok())
                        .is_some_and(|i| i == idx)
                })
                .collect(),
        )
    }

    /// Closes the stale windows of `node` (`None`: all), or window `id`,
    /// dropping what they covered (`crate::state::stale`).
    pub fn close_stale(&self, node: Option<&sidecache_pool::NodeAddr>, id: Option<u64>) {
        let gone = self.stale.close(node, id);
        if gone.is_empty() {
            return;
        }
        for w in &gone {
            self.l1.invalidate_where(|_, key| w.covers(key));
        }
        self.flights.forget_all();
        self.tracked.flush();
        tracing::info!(
            windows = gone.len(),
            "stale L1 entries dropped (--l1-stale-if-error)"
        );
    }

    /// Drops everything cached (FLUSHALL, keys that cannot be known);
    /// tracking clients are told to drop everything too.
    pub fn invalidate_all(&self) {
        self.l1.clear();
        self.flights.forget_all();
        self.tracked.flush();
    }

    /// Each invalidation channel and whether it is up: one per master
    /// (client tracking), or the one peer channel; empty when there is none.
    pub fn tracking_shards(&self) -> Vec<(String, bool)> {
        if let Some(p) = self.upstream.peer() {
            let name = format!("peer:{}", String::from_utf8_lossy(p.name()));
            return vec![(name, p.is_up())];
        }
        self.upstream
            .topology()
            .nodes()
            .iter()
            .filter_map(|n| Some((n.addr().to_string(), n.tracking_up()?)))
            .collect()
    }

    /// Invalidation messages received since start (client tracking pushes
    /// or other sidecaches' peer messages).
    pub fn invalidations_received(&self) -> u64 {
        let tracked = self
            .upstream
            .coherence_stats()
            .map_or(0, |s| s.messages.load(Ordering::Relaxed));
        let peer = self
            .upstream
            .peer()
            .map_or(0, |p| p.received.load(Ordering::Relaxed));
        tracked + peer
    }

    /// `off` (no channel), `up` (every channel), `down` (none) or `partial`.
    pub fn tracking_state(&self) -> &'static str {
        let shards = self.tracking_shards();
        let up = shards.iter().filter(|s| s.1).count();
        match (shards.len(), up) {
            (0, _) => "off",
            (n, u) if n == u => "up",
            (_, 0) => "down",
            _ => "partial",
        }
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
            shared.tracked.release(0);
        }
    }

    fn refilled(
        &self,
        db: u16,
        key: &Bytes,
        written: std::time::Instant,
        value: Option<&Bytes>,
        pttl: i64,
        sent: std::time::Instant,
    ) -> bool {
        self.0.upgrade().is_some_and(|shared| {
            shared
                .l1
                .refill_written(db, key, written, value, pttl, sent)
        })
    }

    fn landed(&self, db: u16, written: &mut dyn Iterator<Item = (&[u8], std::time::Instant)>) {
        if let Some(shared) = self.0.upgrade() {
            for (k, at) in written {
                shared.l1.release_written(db, k, at);
            }
        }
    }
}

/// Applies what the invalidation channels report to the L1 (and forgets
/// flights begun before, so no reader joins a fetch that may predate the
/// change).
#[derive(Debug)]
pub struct FollowInvalidations(pub std::sync::Weak<Shared>);

impl sidecache_pool::coherence::tracking::CoherenceListener for FollowInvalidations {
    fn invalidate(&self, keys: &[Bytes]) {
        let Some(shared) = self.0.upgrade() else {
            return;
        };
        shared.forget_everywhere(keys);
        shared.tracked.invalidate_learned(keys);
        shared.tracked.release(0);
    }

    /// The L1 forgets them as for any report (Redis stopped following
    /// them for that connection, in every database); tracking clients
    /// are not told again of a write they were told of at its
    /// acknowledgement (and may have read since).
    /// With `written_db`, the report came right after the write on its
    /// own connection: what that database caches for the keys is the
    /// write's value or newer, and stays (`sidecache_pool::coherence::refill`).
    fn invalidate_echo(&self, keys: &[Bytes], written_db: Option<u16>) {
        if let Some(shared) = self.0.upgrade() {
            shared.forget_everywhere_but(keys, written_db);
        }
    }

    fn reset_node(&self, node: &sidecache_pool::NodeAddr) {
        let Some(shared) = self.0.upgrade() else {
            return;
        };
        match shared.covered(node) {
            Covered::All => shared.invalidate_all(),
            Covered::Nothing => {}
            Covered::Slots(owned) => {
                shared
                    .l1
                    .invalidate_where(|_, key| crate::state::stale::slot_in(&owned, key));
                shared.flights.forget_all();
                // Tracking clients cannot be told which keys: everything.
                shared.tracked.flush();
            }
        }
    }

    /// With `--l1-stale-if-error`, a lost channel's entries stay, served
    /// for a bounded time (`crate::state::stale`); else they go.
    fn lost(&self, node: Option<&sidecache_pool::NodeAddr>) {
        let Some(shared) = self.0.upgrade() else {
            return;
        };
        let Some(limit) = shared.stale.limit() else {
            return node.map_or_else(|| self.reset_all(), |n| self.reset_node(n));
        };
        let slots = match node.map(|n| shared.covered(n)) {
            None | Some(Covered::All) => None,
            Some(Covered::Slots(s)) => Some(s),
            Some(Covered::Nothing) => return,
        };
        // Fills in flight were registered on the lost connection.
        shared.l1.discard_fills();
        shared.flights.forget_all();
        shared.tracked.flush();
        if let Some((id, until)) = shared.stale.open(node, slots) {
            tracing::warn!(node = ?node.map(ToString::to_string), ?limit, "invalidation channel lost; its L1 entries are served until it is back, for at most --l1-stale-if-error");
            let weak = self.0.clone();
            if tokio::runtime::Handle::try_current().is_ok() {
                tokio::spawn(watch_stale(weak, id, until));
            }
        }
    }

    fn resumed(&self, node: Option<&sidecache_pool::NodeAddr>) {
        if let Some(shared) = self.0.upgrade() {
            if shared.stale.active() {
                shared.close_stale(node, None);
            }
        }
    }

    fn reset_all(&self) {
        if let Some(shared) = self.0.upgrade() {
            shared.stale.close(None, None);
            shared.invalidate_all();
        }
    }
}

/// What one channel covers (`Shared::covered`).
enum Covered {
    All,
    Slots(Box<[bool]>),
    Nothing,
}

/// Watches stale window `id` until it closes: asks for a slot-map refresh
/// every [`crate::state::stale::REFRESH_EVERY`] (the install of a new
/// master drops the window), and closes it at `until`, dropping what it
/// covered.
async fn watch_stale(shared: std::sync::Weak<Shared>, id: u64, until: Instant) {
    loop {
        let now = Instant::now();
        if now >= until {
            break;
        }
        tokio::time::sleep(crate::state::stale::REFRESH_EVERY.min(until - now)).await;
        let Some(s) = shared.upgrade() else {
            return;
        };
        if !s.stale.is_open(id) {
            return;
        }
        s.upstream.request_refresh();
    }
    if let Some(s) = shared.upgrade() {
        s.close_stale(None, Some(id));
    }
}
